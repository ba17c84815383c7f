#include "experts/io.h"

#include <liburing.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "base/check.h"
#include "base/status.h"

namespace magnetar::experts {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A read's buffers from iov[*first] on are what is left to read; takes n more bytes as read. False when none is left.
bool consume(std::vector<iovec>& iov, size_t* first, size_t n) {
  while (*first < iov.size() && n >= iov[*first].iov_len) n -= iov[(*first)++].iov_len;
  if (*first == iov.size()) return false;
  iov[*first].iov_base = static_cast<uint8_t*>(iov[*first].iov_base) + n;
  iov[*first].iov_len -= n;
  return true;
}

// ---- io_uring ------------------------------------------------------------------------------------------------
// One ring of `depth` entries; each in-flight read owns a slot (its iovecs, progress and start time); user_data is
// the slot index. Reads beyond the queue depth wait in a backlog (submit never blocks, so the caller can compute
// while the disk works) and are started as completions free slots. A short completion queues the rest of its read
// in the same slot, as the pread pool re-reads the rest: a read completes with all its bytes, the bytes up to the
// end of the file, or an error.

class UringReader final : public Reader {
 public:
  UringReader(int depth, CompletionFault fault) : depth_(depth), fault_(std::move(fault)), slots_(size_t(depth)) {
    for (int i = depth - 1; i >= 0; --i) free_.push_back(i);
  }
  ~UringReader() override {
    std::vector<Completion> drain;
    if (!ready_) return;
    while (in_flight_ > 0) reap(1, drain);
    io_uring_queue_exit(&ring_);
  }
  int init() {
    const int r = io_uring_queue_init(unsigned(depth_), &ring_, 0);
    ready_ = r == 0;
    return r;
  }

  std::string name() const override { return "io_uring (queue depth " + std::to_string(depth_) + ")"; }
  size_t in_flight() const override { return in_flight_; }

  void submit(int fd, uint64_t offset, std::span<const iovec> iov, uint64_t tag) override {
    ++in_flight_;
    backlog_.push_back({.fd = fd, .offset = offset, .iov = {iov.begin(), iov.end()}, .tag = tag, .start = Clock::now()});
    start_backlog();
  }

  void reap(size_t min, std::vector<Completion>& out) override {
    collect(min > done_.size() ? min - done_.size() : 0);
    collect(0);
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
  }

 private:
  struct Slot {
    std::vector<iovec> iov;  // from iov[first] on: what is left to read
    size_t first = 0;
    int fd = -1;
    uint64_t offset = 0;
    int64_t done = 0;  // bytes read so far
    uint64_t tag = 0;
    Clock::time_point start;
    int retries = 0;  // completions with EAGAIN / EINTR reissued
  };
  struct Pending {
    int fd;
    uint64_t offset;
    std::vector<iovec> iov;
    uint64_t tag;
    Clock::time_point start;
  };

  void start_backlog() {
    while (!backlog_.empty() && broken_ != 0) {  // the ring is unusable: every read fails with its error
      done_.push_back({.tag = backlog_.front().tag, .result = broken_, .seconds = 0});
      backlog_.pop_front();
      --in_flight_;
    }
    while (!backlog_.empty() && !free_.empty()) {
      Pending& p = backlog_.front();
      start(p.fd, p.offset, std::move(p.iov), p.tag, p.start);
      backlog_.pop_front();
    }
  }

  void start(int fd, uint64_t offset, std::vector<iovec> iov, uint64_t tag, Clock::time_point t0) {
    const int s = free_.back();
    free_.pop_back();
    slots_[size_t(s)] = {
        .iov = std::move(iov), .first = 0, .fd = fd, .offset = offset, .done = 0, .tag = tag, .start = t0};
    queue(s);
  }

  // Queues the rest of slot s's read.
  void queue(int s) {
    if (broken_ != 0) return finish(s, broken_);
    Slot& slot = slots_[size_t(s)];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    MAGNETAR_CHECK(sqe != nullptr);  // at most `depth` in flight, the ring has `depth` entries
    io_uring_prep_readv(sqe, slot.fd, slot.iov.data() + slot.first, unsigned(slot.iov.size() - slot.first),
                        slot.offset + uint64_t(slot.done));
    io_uring_sqe_set_data64(sqe, uint64_t(s));
    // The entry is in the submission ring once io_uring_submit is called, whatever it returns: a transient refusal
    // (EAGAIN: no kernel memory for it now; EBUSY) leaves it there for the next submit, so it is retried until the
    // kernel takes it (completing the read with the error would free its slot for a new read while the old one can
    // still run and complete under the same slot).
    int r;
    while ((r = io_uring_submit(&ring_)) == -EINTR || r == -EAGAIN || r == -EBUSY) {
      if (r != -EINTR) std::this_thread::yield();
    }
    if (r < 0) {
      // The ring refused the entry for good (a bad ring or arguments). The entry may still sit in the submission
      // ring, where any later submit would start it into a slot given to another read: no submit ever follows.
      broken_ = r;
      finish(s, r);
    }
  }

  void finish(int s, int64_t result) {
    done_.push_back({.tag = slots_[size_t(s)].tag, .result = result, .seconds = since(slots_[size_t(s)].start)});
    free_.push_back(s);
    --in_flight_;
  }

  // Moves completions from the ring to done_, waiting for `want` of them (0: only what is there).
  void collect(size_t want) {
    size_t got = 0;
    for (;;) {
      if (got < want && in_flight_ == 0) return;  // nothing left that could complete
      io_uring_cqe* cqe = nullptr;
      int r = got < want ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0 || cqe == nullptr) return;
      const int s = int(io_uring_cqe_get_data64(cqe));
      Slot& slot = slots_[size_t(s)];
      const int res = fault_ ? fault_(cqe->res, slot.retries) : cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      // Kernels before ~6.2 may complete a large O_DIRECT read with EAGAIN when the device queue is busy: the
      // application is to reissue it (liburing's maintainers), a few times before it counts as a failure.
      if ((res == -EAGAIN || res == -EINTR) && slot.retries < kMaxRetries) {
        // A busy queue drains over milliseconds: 50 us, doubling, up to ~13 ms (~50 ms over all the retries).
        std::this_thread::sleep_for(std::chrono::microseconds(50 << std::min(slot.retries, 8)));
        ++slot.retries;
        queue(s);
        continue;
      }
      if (res > 0) slot.done += res;
      if (res > 0 && consume(slot.iov, &slot.first, size_t(res))) {
        queue(s);  // short: read the rest
        continue;
      }
      finish(s, res < 0 ? int64_t(res) : slot.done);
      ++got;
      start_backlog();
    }
  }

  static constexpr int kMaxRetries = 12;
  int depth_;
  CompletionFault fault_;
  bool ready_ = false;
  int broken_ = 0;  // a submit's lasting error (negative errno): the ring is not used again
  io_uring ring_{};
  std::vector<Slot> slots_;
  std::vector<int> free_;
  std::vector<Completion> done_;
  std::deque<Pending> backlog_;
  size_t in_flight_ = 0;  // submitted and not yet reaped (started or in the backlog)
};

// ---- pread pool ----------------------------------------------------------------------------------------------

class PreadReader final : public Reader {
 public:
  explicit PreadReader(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~PreadReader() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    todo_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  std::string name() const override { return "pread (" + std::to_string(workers_.size()) + " threads)"; }
  size_t in_flight() const override { return in_flight_; }

  void submit(int fd, uint64_t offset, std::span<const iovec> iov, uint64_t tag) override {
    {
      std::lock_guard lock(mu_);
      todo_.push_back({.fd = fd, .offset = offset, .iov = {iov.begin(), iov.end()}, .tag = tag, .start = Clock::now()});
    }
    ++in_flight_;
    todo_cv_.notify_one();
  }

  void reap(size_t min, std::vector<Completion>& out) override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= std::min(min, in_flight_); });
    in_flight_ -= done_.size();
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
  }

 private:
  struct Job {
    int fd;
    uint64_t offset;
    std::vector<iovec> iov;
    uint64_t tag;
    Clock::time_point start;
  };

  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        todo_cv_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (todo_.empty()) return;
        job = std::move(todo_.front());
        todo_.pop_front();
      }
      // preadv may return short (signals, end of file): continue until done, an error or end of file.
      int64_t total = 0;
      std::vector<iovec> rest = job.iov;
      size_t first = 0;
      for (;;) {
        const ssize_t r = preadv(job.fd, rest.data() + first, int(rest.size() - first), off_t(job.offset + total));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          total = -errno;
          break;
        }
        if (r == 0) break;
        total += r;
        if (!consume(rest, &first, size_t(r))) break;
      }
      {
        std::lock_guard lock(mu_);
        done_.push_back({.tag = job.tag, .result = total, .seconds = since(job.start)});
      }
      done_cv_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable todo_cv_, done_cv_;
  std::deque<Job> todo_;
  std::vector<Completion> done_;
  std::vector<std::thread> workers_;
  size_t in_flight_ = 0;  // touched only by the owning thread
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<Reader> make_uring_reader(int queue_depth, std::string* why, CompletionFault fault) {
  auto reader = std::make_unique<UringReader>(queue_depth, std::move(fault));
  if (const int r = reader->init(); r < 0) {
    if (why) *why = std::string("io_uring_queue_init: ") + std::strerror(-r);
    return nullptr;
  }
  return reader;
}

std::unique_ptr<Reader> make_pread_reader(int threads) { return std::make_unique<PreadReader>(threads); }

}  // namespace magnetar::experts
