// A brake for the kill tests of the file writers (tests/tools/pack_test.cpp), loaded with LD_PRELOAD into `magnetar
// pack`: each fwrite of at least 64 KiB (tensor data, not the header's fields) first sleeps
// MAGNETAR_TEST_WRITE_DELAY_US microseconds. A small model then takes as long to write as a large one, so that a kill
// at a random moment lands while the file is being written, without gigabytes of disk traffic slowing the tests that
// run beside it.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {
using Fwrite = size_t (*)(const void*, size_t, size_t, FILE*);
}  // namespace

extern "C" size_t fwrite(const void* data, size_t size, size_t count, FILE* file) {
  static const Fwrite real = reinterpret_cast<Fwrite>(dlsym(RTLD_NEXT, "fwrite"));
  static const long delay_us = [] {
    const char* v = std::getenv("MAGNETAR_TEST_WRITE_DELAY_US");
    return v != nullptr ? std::atol(v) : 0L;
  }();
  if (delay_us > 0 && size * count >= (size_t(64) << 10)) usleep(useconds_t(delay_us));
  return real(data, size, count, file);
}
