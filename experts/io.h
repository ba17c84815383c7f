// Asynchronous reads for the expert store: io_uring when the kernel allows it, otherwise a pool of threads
// doing preadv. Both take a read into a list of buffers (so adjacent records of the file land in separate
// cache slots with one request) and report completions with the time each read took.
//
// Thread-safety: a Reader is used by one thread (the one running forward()); the pread pool's workers are
// internal.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace magnetar::experts {

struct Completion {
  uint64_t tag = 0;
  int64_t result = 0;    // bytes read, or -errno
  double seconds = 0;    // from submit to completion
};

class Reader {
 public:
  virtual ~Reader() = default;
  virtual std::string name() const = 0;  // "io_uring (queue depth 32)", "pread (4 threads)"
  // Queues one read of sum(iov lengths) bytes at `offset` of `fd` into the buffers of `iov` (copied; the
  // buffers must stay valid until the completion is reaped). Blocks only while the queue is full.
  virtual void submit(int fd, uint64_t offset, std::span<const iovec> iov, uint64_t tag) = 0;
  // Waits until at least `min` completions are available (0: do not wait) and appends all available.
  virtual void reap(size_t min, std::vector<Completion>& out) = 0;
  virtual size_t in_flight() const = 0;
};

// For tests of the io_uring reader's reissues: called with each completion's result as the kernel gave it and the
// times its read was reissued after EAGAIN / EINTR so far; returns the result the reader acts on.
using CompletionFault = std::function<int(int result, int reissues)>;

// nullptr when io_uring cannot be set up here (kernel too old, disabled by sysctl or seccomp); `why` says why.
// `fault`: tests only (empty: the kernel's results as they are).
std::unique_ptr<Reader> make_uring_reader(int queue_depth, std::string* why, CompletionFault fault = {});
std::unique_ptr<Reader> make_pread_reader(int threads);

}  // namespace magnetar::experts
