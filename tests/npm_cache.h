// The npm cache the parity tests share (tests/tokenizer/parity_test.cpp, tests/chat/jinja_parity_test.cpp):
// pinned reference packages are installed on first use into ~/.cache/magnetar/npm (or the build folder when
// HOME is unset), under a lock, and a test SKIPs with the reason when node, npm or the registry is missing.
// Needs MAGNETAR_BUILD_DIR defined by the test target.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace magnetar::testing {

inline std::string npm_dir() {
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/magnetar/npm";
  return std::string(MAGNETAR_BUILD_DIR) + "/npm-cache";
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline int run_shell(const std::string& command) {
  const int st = std::system(command.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

inline std::string tail_of(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

// The first line of npm's log that says what went wrong ("npm error code ECONNREFUSED"), else its tail.
inline std::string npm_error(const std::string& log_path) {
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    if (line.find("error code") != std::string::npos || line.find("ERR!") != std::string::npos) return line;
  }
  return tail_of(log_path, 300);
}

// Installs `packages` (a space-separated list of pinned name@version) into npm_dir() unless a previous run
// did. Holds an exclusive lock on the folder meanwhile: ctest runs tests in parallel processes. Returns ""
// or why the tests must skip. The marker file lists each installed package set on a line of its own, so
// suites with different sets share the folder without reinstalling each other's. A failed install is
// remembered for kRetryAfter so that the other tests of the same run skip at once instead of each waiting
// out npm's network timeouts.
inline std::string ensure_npm_packages(const std::string& packages) {
  namespace fs = std::filesystem;
  constexpr auto kRetryAfter = std::chrono::minutes(15);
  const std::string dir = npm_dir();
  char set_id[32];
  std::snprintf(set_id, sizeof(set_id), "%016zx", std::hash<std::string>()(packages));
  const std::string marker = dir + "/.magnetar-installed";
  const std::string failed = dir + "/.magnetar-install-failed-" + set_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return "cannot create " + dir + ": " + ec.message();
  const int lock = open((dir + "/.lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0) return "cannot open " + dir + "/.lock";
  flock(lock, LOCK_EX);
  std::string reason;
  bool installed = false;
  {
    std::ifstream m(marker);
    for (std::string line; std::getline(m, line);) installed = installed || line == packages;
  }
  if (!installed) {
    const auto failed_at = fs::last_write_time(failed, ec);
    if (!ec && fs::file_time_type::clock::now() - failed_at < kRetryAfter) {
      reason =
          tail_of(failed, 400) + " (an install failed less than 15 minutes ago; delete " + failed + " to retry now)";
    } else if (run_shell("command -v node >/dev/null 2>&1") != 0) {
      reason = "node not found on PATH";
    } else if (run_shell("command -v npm >/dev/null 2>&1") != 0) {
      reason = "npm not found on PATH";
    } else {
      const std::string log = dir + "/install.log";
      // Short network timeouts: npm's defaults wait minutes for an unreachable registry.
      const std::string cmd = "timeout 240 npm install --prefix " + shell_quote(dir) +
                              " --no-audit --no-fund --loglevel=error --fetch-retries=1 --fetch-retry-mintimeout=2000"
                              " --fetch-retry-maxtimeout=10000 --fetch-timeout=60000 " +
                              packages + " >" + shell_quote(log) + " 2>&1";
      if (run_shell(cmd) != 0) {
        reason = "npm install failed (registry unreachable?): " + npm_error(log);
        std::ofstream(failed) << reason;
      } else {
        // Ends the previous line first: older markers hold one set without a newline.
        std::ofstream(marker, std::ios::app) << "\n" << packages << "\n";
        fs::remove(failed, ec);
      }
    }
  }
  flock(lock, LOCK_UN);
  close(lock);
  return reason;
}

}  // namespace magnetar::testing
