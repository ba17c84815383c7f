// A fault injector for the server tests (tests/server/parallel_test.cpp), loaded with LD_PRELOAD into `magnetar
// serve --no-io-uring` (experts read by the pread pool): while the file MAGNETAR_TEST_EIO_TRIGGER names exists, the
// next preadv of a .gguf file deletes it and fails with EIO (a disk's transient read error), so a test makes exactly
// one read fail at the moment it chooses. Every other call goes to the C library's preadv.
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>

namespace {

using Preadv = ssize_t (*)(int, const iovec*, int, off_t);

bool is_model_file(int fd) {
  char link[64], path[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  return n > 5 && memcmp(path + n - 5, ".gguf", 5) == 0;
}

ssize_t read_or_fail(const char* name, int fd, const iovec* iov, int count, off_t offset) {
  static const Preadv real_preadv = reinterpret_cast<Preadv>(dlsym(RTLD_NEXT, "preadv"));
  static const Preadv real_preadv64 = reinterpret_cast<Preadv>(dlsym(RTLD_NEXT, "preadv64"));
  const char* trigger = getenv("MAGNETAR_TEST_EIO_TRIGGER");
  if (trigger != nullptr && is_model_file(fd) && unlink(trigger) == 0) {  // unlink: one caller wins the fault
    errno = EIO;
    return -1;
  }
  const Preadv real = strcmp(name, "preadv64") == 0 ? real_preadv64 : real_preadv;
  return real(fd, iov, count, offset);
}

}  // namespace

extern "C" ssize_t preadv(int fd, const iovec* iov, int count, off_t offset) {
  return read_or_fail("preadv", fd, iov, count, offset);
}
extern "C" ssize_t preadv64(int fd, const iovec* iov, int count, off_t offset) {
  return read_or_fail("preadv64", fd, iov, count, offset);
}
