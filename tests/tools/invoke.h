// Running the `magnetar` binary from tests: exit status, stdout and stderr of one invocation.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/unit/gguf_test_util.h"

namespace magnetar::testing {

struct Invocation {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `magnetar ARGS` through the shell (ARGS may hold redirections).
inline Invocation run_magnetar(const std::string& args) {
  TempDir dir;
  const std::string cmd = std::string(MAGNETAR_BINARY) + " " + args + " 2>" + dir.file("err");
  Invocation r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(dir.file("err"));
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

}  // namespace magnetar::testing
