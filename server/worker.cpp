#include "server/worker.h"

#include <algorithm>
#include <chrono>

namespace magnetar::server {

size_t stop_prefix_overlap(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(stop.size() - 1, text.size()); k > best; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

std::unique_ptr<Worker> Worker::start(const Engine& engine, std::unique_ptr<Session> session,
                                      double keepalive_seconds) {
  std::unique_ptr<Worker> w(new Worker(engine, std::move(session), keepalive_seconds));
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

Worker::Worker(const Engine& engine, std::unique_ptr<Session> session, double keepalive_seconds)
    : engine_(engine), keepalive_seconds_(keepalive_seconds), session_(std::move(session)) {
  stats_.experts = engine_.expert_stats();  // no forward runs yet
}

WorkerStats Worker::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerStats s = stats_;
  s.queued = int64_t(queue_.size());
  return s;
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const std::shared_ptr<Job>& job : queue_) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->done = true;
    job->finish = FinishReason::kCancelled;
    job->cv.notify_all();
  }
}

void Worker::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Worker::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      stats_.active = 1;  // cleared by run()'s finish, before the job is signalled done
    }
    run(*job);
  }
}

// Generates for one job. Text goes to job.pending_text as it is produced, except the tail that could still
// become a stop string; the session keeps the prompt and the generated tokens for the next request's sync.
void Worker::run(Job& job) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_start = Clock::now();
  Clock::time_point t_prompt_end = t_start;  // end of sync (successful or not)
  bool generating = false;                   // sync succeeded: the time after t_prompt_end is generation
  // Publishes this job's counts (before `done`, see WorkerStats), then ends the job.
  auto finish = [&](FinishReason reason, std::string tail, std::string error = {}) {
    const Clock::time_point t_end = Clock::now();
    const ExpertStats experts = engine_.expert_stats();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens += uint64_t(job.started ? job.prompt_tokens : 0);
      stats_.cached_tokens += uint64_t(job.started ? job.cached_tokens : 0);
      stats_.generated_tokens += uint64_t(job.completion_tokens);
      stats_.prompt_seconds += std::chrono::duration<double>(t_prompt_end - t_start).count();
      if (generating) stats_.generation_seconds += std::chrono::duration<double>(t_end - t_prompt_end).count();
      stats_.active = 0;
      stats_.experts = experts;
    }
    std::lock_guard<std::mutex> lock(job.mu);
    job.pending_text += tail;
    job.finish = reason;
    job.error = std::move(error);
    job.done = true;
    job.cv.notify_all();
  };
  auto emit = [&job](std::string text, int64_t completion_tokens) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.pending_text += text;
    job.completion_tokens = completion_tokens;
    job.cv.notify_all();
  };
  if (job.cancelled.load()) return finish(FinishReason::kCancelled, {});

  // Reused prefix: the common prefix with the previous timeline, less the last prompt token, which sync
  // always recomputes (its logits are needed).
  const std::vector<int32_t>& previous = session_->tokens();
  const size_t common =
      std::mismatch(previous.begin(), previous.end(), job.prompt.begin(), job.prompt.end()).first - previous.begin();
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.prompt_tokens = int64_t(job.prompt.size());
    job.cached_tokens = int64_t(std::min(common, job.prompt.size() - 1));
    job.started = true;
    job.cv.notify_all();
  }
  // After each prefill chunk: stop when the client is gone (the computed prefix stays cached), and ask the HTTP
  // side for a keep-alive when a stream has been silent for keepalive_seconds_.
  Clock::time_point last_output = t_start;
  const Status synced = session_->sync(job.prompt, Logits::kLast, [&](int64_t, int64_t) {
    if (job.cancelled.load()) return false;
    if (job.stream && std::chrono::duration<double>(Clock::now() - last_output).count() >= keepalive_seconds_) {
      last_output = Clock::now();
      std::lock_guard<std::mutex> lock(job.mu);
      ++job.keepalives;
      job.cv.notify_all();
    }
    return true;
  });
  t_prompt_end = Clock::now();
  if (!synced.ok() && job.cancelled.load()) return finish(FinishReason::kCancelled, {});
  if (!synced.ok()) return finish(FinishReason::kError, {}, synced.message());
  generating = true;

  Sampler sampler(job.sampling);
  std::unique_ptr<Detokenizer> detok = engine_.new_detokenizer();
  std::string held;  // text not yet emitted: it could be the start of a stop string
  // Emits what cannot be part of a stop string; returns true (and finishes) when one is complete.
  auto scan = [&](int64_t n) {
    size_t cut = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& stop : job.stop) {
      if (const size_t at = held.find(stop); at < cut) {
        cut = at;
        matched = &stop;
      }
    }
    if (cut != std::string::npos) {
      held.resize(cut);
      std::lock_guard<std::mutex> lock(job.mu);
      job.stop_sequence = *matched;
      job.completion_tokens = n;
      return true;
    }
    const size_t keep = stop_prefix_overlap(held, job.stop);
    emit(held.substr(0, held.size() - keep), n);
    held.erase(0, held.size() - keep);
    return false;
  };
  for (int64_t n = 0;;) {
    if (job.cancelled.load()) return finish(FinishReason::kCancelled, {});
    const int32_t id = sampler.sample(session_->logits(), session_->tokens());
    if (engine_.is_end_of_generation(id)) {
      held += detok->flush();
      scan(n);
      return finish(FinishReason::kStop, std::move(held));
    }
    ++n;
    held += detok->push(id);
    if (scan(n)) return finish(FinishReason::kStop, std::move(held));
    // The sampled token is not computed when generation ends here: the next request's sync recomputes it.
    if (n >= job.max_tokens || int64_t(session_->tokens().size()) + 1 >= session_->n_ctx()) {
      held += detok->flush();
      if (scan(n)) return finish(FinishReason::kStop, std::move(held));
      return finish(FinishReason::kLength, std::move(held));
    }
    if (Status s = session_->step(id); !s.ok()) return finish(FinishReason::kError, {}, s.message());
  }
}

}  // namespace magnetar::server
