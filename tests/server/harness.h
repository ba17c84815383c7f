// The harness of the `magnetar serve` tests: each suite (a fixture derived from ServeFixture) starts the binary on
// the bundled demo model (models/magnetar-demo-q8_0.gguf) on an ephemeral port, drives it with httplib::Client and
// kills it when the suite ends. The expected answer to "Who are you?" is PyTorch's greedy sample
// (models/magnetar-demo.report.json); the expected prompt is ChatML written out by hand here.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace magnetar::test {

using nlohmann::json;

inline const std::string kModel = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
inline const std::string kPrompt =
    "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
inline const std::string kAnswerStart = "I am a tiny language model";

// The server process of the running suite (its tests run in order; TearDownTestSuite kills it).
struct ServerProcess {
  pid_t pid = -1;
  int err_fd = -1;  // the read end of its stderr
  int port = 0;
  std::string err;
};

class ServeFixture : public ::testing::Test {
 protected:
  inline static ServerProcess* server = nullptr;
  static void SetUpTestSuite() { start_server({}); }
  // Starts the server with `extra` flags after the default ones (a suite that needs other flags defines its own
  // SetUpTestSuite calling this) and `env` (name, value) added to its environment.
  static void start_server(const std::vector<std::string>& extra,
                           const std::vector<std::pair<std::string, std::string>>& env = {}) {
    signal(SIGPIPE, SIG_IGN);
    server = new ServerProcess;
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    server->pid = fork();
    if (server->pid == 0) {
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      std::vector<std::string> args = {MAGNETAR_BINARY, "serve", "-m", kModel, "--port", "0", "-t", "2"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(MAGNETAR_BINARY, argv.data());
      _exit(127);
    }
    close(fds[1]);
    server->err_fd = fds[0];
    // Reads stderr up to the line that says the socket is bound.
    const std::string marker = "listening on http://127.0.0.1:";
    char buf[512];
    while (server->err.find('\n', server->err.find(marker)) == std::string::npos ||
           server->err.find(marker) == std::string::npos) {
      const ssize_t n = read(server->err_fd, buf, sizeof(buf));
      if (n <= 0) break;
      server->err.append(buf, size_t(n));
    }
    const size_t at = server->err.find(marker);
    ASSERT_NE(at, std::string::npos) << server->err;
    server->port = std::stoi(server->err.substr(at + marker.size()));
  }
  static void TearDownTestSuite() {
    if (server && server->pid > 0) {
      kill(server->pid, SIGKILL);
      waitpid(server->pid, nullptr, 0);
    }
    if (server && server->err_fd >= 0) close(server->err_fd);
    delete server;
    server = nullptr;
  }
  void SetUp() override { ASSERT_GT(server->port, 0) << "the server did not start"; }

  // Reads the server's stderr until `text` appears in what it wrote since it started (true) or `seconds` pass.
  static bool wait_for_stderr(const std::string& text, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (server->err.find(text) == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{.fd = server->err_fd, .events = POLLIN, .revents = 0};
      if (left.count() <= 0 || poll(&p, 1, int(left.count())) <= 0) return false;
      char buf[512];
      const ssize_t n = read(server->err_fd, buf, sizeof(buf));
      if (n <= 0) return false;
      server->err.append(buf, size_t(n));
    }
    return true;
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server->port);
    c.set_read_timeout(60);
    return c;
  }
  // The value of an unlabelled metric of GET /metrics (-1, and a failure, when it is not there).
  static double metric(const std::string& name) {
    httplib::Client c = client();
    httplib::Result r = c.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    if (!r || r->status != 200) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name;
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2));
  }
  // A raw TCP connection to the server (tests that write requests by hand or hang up mid-answer); -1 on failure.
  static int raw_connect() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(server->port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }
  // Writes `request` on a new connection and reads one answer (its headers, then Content-Length bytes of body, or up
  // to the server's close).
  static std::string raw_exchange(const std::string& request) {
    const int fd = raw_connect();
    if (fd < 0) return "";
    timeval timeout{.tv_sec = 30, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    std::string answer;
    if (write(fd, request.data(), request.size()) == ssize_t(request.size())) {
      char buf[4096];
      for (;;) {
        const size_t end = answer.find("\r\n\r\n");
        if (end != std::string::npos) {
          const size_t at = answer.find("Content-Length: ");
          const size_t length = at < end ? std::stoul(answer.substr(at + 16)) : 0;
          if (answer.size() >= end + 4 + length) break;
        }
        const ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        answer.append(buf, size_t(n));
      }
    }
    close(fd);
    return answer;
  }
  static json post(const std::string& path, const json& body, int* status = nullptr) {
    httplib::Client c = client();
    httplib::Result r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    if (status) *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  static std::string raw_post(const std::string& path, const std::string& body, int* status) {
    httplib::Client c = client();
    httplib::Result r = c.Post(path.c_str(), body, "application/json");
    if (!r) return "";
    *status = r->status;
    return r->body;
  }
};

// The events of an SSE body: (event name, or "" when the event has no `event:` line; data).
inline std::vector<std::pair<std::string, std::string>> sse_events(const std::string& body) {
  std::vector<std::pair<std::string, std::string>> events;
  for (size_t at = 0; at < body.size();) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    std::string name, data;
    for (size_t line = at; line < end;) {
      size_t eol = body.find('\n', line);
      if (eol == std::string::npos || eol > end) eol = end;
      const std::string l = body.substr(line, eol - line);
      if (l.rfind("event: ", 0) == 0) name = l.substr(7);
      if (l.rfind("data: ", 0) == 0) data = l.substr(6);
      line = eol + 1;
    }
    if (!name.empty() || !data.empty()) events.emplace_back(name, data);
    at = end + 2;
  }
  return events;
}

}  // namespace magnetar::test
