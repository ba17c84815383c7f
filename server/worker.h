// The one thread that owns the engine's Session and does all compute (STYLE.md rule 10). HTTP threads build a
// Job (plain data: prompt ids, sampling, limits), submit it, and read its output under the job's own mutex;
// the worker runs jobs in FIFO order on one slot (one Session), keeping the KV of the previous request so that
// Session::sync reuses the common prefix.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace magnetar::server {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

// One generation request and its output. The inputs are set before submit() and not touched after; the output
// fields are guarded by `mu` and signalled on `cv` whenever text arrives or the job ends.
struct Job {
  // ---- input (immutable once submitted)
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;         // > 0
  std::vector<std::string> stop;  // non-empty strings; the output ends before the first one found
  bool stream = false;            // streamed to the client: keep-alives are requested during a long prefill

  // ---- cancellation: set by the HTTP thread (client gone); the worker checks it before every token and after
  // every prefill chunk (Session::sync's progress hook), so a client that leaves stops the prefill within a chunk
  std::atomic<bool> cancelled{false};

  // ---- output, guarded by mu
  std::mutex mu;
  std::condition_variable cv;
  std::string pending_text;  // produced and not yet taken by the HTTP thread
  int64_t keepalives = 0;    // keep-alives requested by the worker and not yet taken (stream jobs only)
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  std::string error;          // when finish == kError
  std::string stop_sequence;  // the stop string that ended the output (finish == kStop), else empty
  bool started = false;       // the worker has taken the job: prompt_tokens and cached_tokens are final
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was reused from the previous request
  int64_t completion_tokens = 0;
};

// Totals over every job the worker has run, and its state now; for /metrics. Published by the worker thread
// under its lock before the job's `done` is signalled, so a client that has its answer sees its counts.
struct WorkerStats {
  uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prompt_seconds = 0, generation_seconds = 0;  // wall time in Session::sync, and in the sampling loop
  int64_t active = 0;                                 // jobs running (0 or 1)
  int64_t queued = 0;                                 // jobs submitted and not started
  // Engine::expert_stats() as the worker read it after its last job (Engine is not safe to read during a
  // forward, so HTTP threads never call it).
  ExpertStats experts;
};

class Worker {
 public:
  // `engine` must outlive the worker, which takes `session` (of that engine) and starts its thread.
  // A streaming job silent for `keepalive_seconds` during its prefill gets a keep-alive (ServerOptions; 0: one
  // after every prefill chunk).
  static std::unique_ptr<Worker> start(const Engine& engine, std::unique_ptr<Session> session,
                                       double keepalive_seconds);
  ~Worker();  // stops the thread; queued jobs end as kCancelled

  void submit(std::shared_ptr<Job> job);
  // Thread-safe: a copy of the published totals.
  WorkerStats stats();

 private:
  Worker(const Engine& engine, std::unique_ptr<Session> session, double keepalive_seconds);
  void loop();
  void run(Job& job);

  const Engine& engine_;
  const double keepalive_seconds_;
  std::unique_ptr<Session> session_;  // touched only by thread_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  WorkerStats stats_;                       // guarded by mu_ (queued is derived from queue_)
  std::thread thread_;
};

// How many bytes at the end of `text` could be the start of one of `stops` (and so must be held back).
size_t stop_prefix_overlap(const std::string& text, const std::vector<std::string>& stops);

}  // namespace magnetar::server
