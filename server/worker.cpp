#include "server/worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "base/check.h"

namespace magnetar::server {

using Clock = std::chrono::steady_clock;

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

size_t choose_slot(const std::vector<SlotView>& slots, std::span<const int32_t> prompt) {
  size_t keeps = SIZE_MAX, keeps_common = 0, shares = SIZE_MAX, shares_common = 0, empty = SIZE_MAX, lru = SIZE_MAX;
  size_t holds = SIZE_MAX, holds_common = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].busy) continue;
    if (lru == SIZE_MAX || slots[i].last_used < slots[lru].last_used) lru = i;
    const std::vector<int32_t>& t = *slots[i].tokens;
    if (t.empty() && empty == SIZE_MAX) empty = i;
    const size_t common = size_t(std::mismatch(t.begin(), t.end(), prompt.begin(), prompt.end()).first - t.begin());
    if (common == 0) continue;
    const size_t last_prompt = slots[i].prompt > 0 ? std::min(slots[i].prompt, t.size()) : t.size();
    if (2 * common >= last_prompt && common > keeps_common) {
      keeps = i;
      keeps_common = common;
    }
    if ((common >= last_prompt || 2 * common >= t.size()) && common > holds_common) {
      holds = i;
      holds_common = common;
    }
    if (2 * common >= std::min(t.size(), prompt.size()) && common > shares_common) {
      shares = i;
      shares_common = common;
    }
  }
  if (holds != SIZE_MAX) return holds;
  if (empty != SIZE_MAX) return empty;
  if (keeps != SIZE_MAX) return keeps;
  return shares != SIZE_MAX ? shares : lru;
}

// ---- one slot: a Session and the job it runs ------------------------------------------------------------------

// The per-job state of a slot, from admission to the job's end. The worker thread owns it.
struct Worker::Slot {
  std::unique_ptr<Session> session;
  uint64_t last_used = 0;     // admission tick of its last job (least recently used goes first)
  size_t last_prompt = 0;     // its last job's prompt tokens
  std::shared_ptr<Job> job;   // null: idle
  bool decoding = false;      // the prompt is computed; sampling
  bool synced_once = false;   // the first sync decided what it reuses (the job's cached tokens are known)
  int64_t restored_counted = 0;  // the session's restored_tokens counted in the job's cached tokens so far
  Clock::time_point t_start, t_prompt_end, last_output;
  std::optional<chat::OutputConstraint> constraint;
  int64_t tokens_left = 0;      // a constrained output: tokens it may still generate, this step's included
  bool closing_forced = false;  // some step had room only for the closing bytes: the output is cut, not finished
  TokenFilter allow;
  std::optional<Sampler> sampler;
  std::unique_ptr<Detokenizer> detok;
  std::string held;           // text not yet emitted: it could be the start of a stop string
  int64_t n = 0;              // tokens generated
  int64_t published_n = 0;    // n when the statistics were last published
  // The jobs' decode loop (--lookup's drafts): one for the slot's life, so that what it measured (what drafts cost,
  // how often they are right) serves the next job too.
  std::optional<LookupDecoder> decoder;
  int64_t drafts0 = 0, accepted0 = 0;  // the session's draft counts when the job came
};

std::unique_ptr<Worker> Worker::start(Engine& engine, std::vector<std::unique_ptr<Session>> sessions,
                                      double keepalive_seconds, int64_t lookup) {
  MAGNETAR_CHECK(!sessions.empty());
  std::unique_ptr<Worker> w(new Worker(engine, std::move(sessions), keepalive_seconds, lookup));
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

Worker::Worker(Engine& engine, std::vector<std::unique_ptr<Session>> sessions, double keepalive_seconds, int64_t lookup)
    : engine_(engine), keepalive_seconds_(keepalive_seconds), lookup_(lookup) {
  for (std::unique_ptr<Session>& s : sessions) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->session = std::move(s);
    slots_.back()->decoder.emplace(*slots_.back()->session);
  }
  stats_.slots = int64_t(slots_.size());
  publish(0, 0);
}

void Worker::publish(int64_t generated_tokens, double generation_seconds) {
  ExpertStats experts = engine_.expert_stats();
  ExpertMap map = engine_.expert_map();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.experts = std::move(experts);
  stats_.expert_map = std::move(map);
  stats_.last_generated_tokens = generated_tokens;
  stats_.last_generation_seconds = generation_seconds;
}

WorkerStats Worker::stats() {
  KvDiskStats kv_disk = engine_.kv_disk_stats(/*settle=*/true);  // blocks being written count once on disk
  std::lock_guard<std::mutex> lock(mu_);
  WorkerStats s = stats_;
  s.kv_disk = std::move(kv_disk);
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
  auto cancel = [](Job& job) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.done = true;
    job.finish = FinishReason::kCancelled;
    job.cv.notify_all();
  };
  for (const std::shared_ptr<Job>& job : queue_) cancel(*job);
  for (const std::unique_ptr<Slot>& slot : slots_) {
    if (slot->job) cancel(*slot->job);
  }
}

void Worker::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closing_) {
      queue_.push_back(std::move(job));
      cv_.notify_one();
      return;
    }
  }
  finish_unstarted(*job);  // the server is stopping
}

void Worker::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;
  for (const std::shared_ptr<Job>& job : queue_) job->cancelled = true;
  for (const std::shared_ptr<Job>& job : running_) job->cancelled = true;
  cv_.notify_all();
}

// ---- the loop --------------------------------------------------------------------------------------------------

// Each turn: admit queued jobs into idle slots (a cancelled one ends at once), compute one prefill step for each
// slot still in its prompt (a whole prompt when nothing else waits, else one --batch chunk or a chunk's worth of a
// prefill sweep, so running streams keep flowing, other prompts take turns and a queued job is admitted at the next
// turn), then one token for every decoding slot in a single batched forward pass.
void Worker::loop() {
  uint64_t tick = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto idle = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return !s->job; });
      };
      auto busy = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job != nullptr; });
      };
      cv_.wait(lock, [&] { return stopping_ || busy() || (!queue_.empty() && idle()); });
      if (stopping_) return;
      // Queued jobs whose client left end here, without waiting for a slot.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->cancelled.load()) {
          finish_unstarted(**it);
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      while (!queue_.empty() && idle()) {
        std::vector<SlotView> views;
        for (const auto& s : slots_) {
          views.push_back({s->job != nullptr, s->last_used, &s->session->tokens(), s->last_prompt});
        }
        const size_t i = choose_slot(views, queue_.front()->prompt);
        Slot& slot = *slots_[i];
        slot.job = std::move(queue_.front());
        queue_.pop_front();
        running_.push_back(slot.job);
        slot.last_prompt = slot.job->prompt.size();
        slot.last_used = ++tick;
        admit(slot);
      }
      stats_.active = std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->job != nullptr; });
    }
    for (const std::unique_ptr<Slot>& s : slots_) {
      if (s->job && !s->decoding) prefill_step(*s);
    }
    decode_step();
  }
}

// A job that never reached a slot (its client left while it was queued).
void Worker::finish_unstarted(Job& job) {
  std::lock_guard<std::mutex> lock(job.mu);
  job.finish = FinishReason::kCancelled;
  job.done = true;
  job.cv.notify_all();
}

void Worker::admit(Slot& slot) {
  Job& job = *slot.job;
  slot.decoding = false;
  slot.synced_once = false;
  slot.t_start = slot.t_prompt_end = slot.last_output = Clock::now();
  slot.constraint.reset();
  slot.tokens_left = 0;
  slot.closing_forced = false;
  slot.allow = {};
  slot.sampler.emplace(job.sampling);
  slot.detok = engine_.new_detokenizer();
  slot.held.clear();
  slot.n = 0;
  slot.published_n = 0;
  slot.drafts0 = slot.session->stats().draft_tokens;
  slot.accepted0 = slot.session->stats().drafts_accepted;
  // The token filter of a constrained job: a token is allowed when its bytes keep the output in the language and
  // closable within the tokens left (OutputConstraint::allows), so a constrained output ends complete within
  // max_tokens (or the context) when it can. End-of-generation and control tokens never are (the worker ends the
  // output itself once the constraint is done).
  if (job.constraint.active()) {
    slot.constraint.emplace(job.constraint);
    slot.allow = [this, &slot](int32_t id) {
      return !engine_.is_end_of_generation(id) && slot.constraint->allows(engine_.token_bytes(id), slot.tokens_left);
    };
  } else if (job.ignore_eos) {
    slot.allow = [this](int32_t id) { return !engine_.is_end_of_generation(id); };
  }
}

// Publishes the job's counts (before `done`, see WorkerStats), ends it and frees the slot.
void Worker::finish(Slot& slot, FinishReason reason, std::string tail, std::string error) {
  Job& job = *slot.job;
  if (reason == FinishReason::kError) std::fprintf(stderr, "magnetar serve: a request failed: %s\n", error.c_str());
  // The timeline keeps what was computed for the output: its wrong guesses go (the last sampled token, never
  // computed, is not in it either: the next request's sync computes it).
  slot.decoder->end();
  const Clock::time_point t_end = Clock::now();
  // (The disk KV's counts are not published: stats() reads them settled, on the caller's thread, so the answer and the
  // next job never wait for the disk's writes.)
  publish(job.completion_tokens, slot.decoding ? std::chrono::duration<double>(t_end - slot.t_prompt_end).count() : 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens += uint64_t(job.started ? job.prompt_tokens : 0);
    stats_.cached_tokens += uint64_t(job.started ? job.cached_tokens : 0);
    stats_.generated_tokens += uint64_t(job.completion_tokens);
    stats_.draft_tokens += uint64_t(slot.session->stats().draft_tokens - slot.drafts0);
    stats_.drafts_accepted += uint64_t(slot.session->stats().drafts_accepted - slot.accepted0);
    stats_.prompt_seconds += std::chrono::duration<double>(slot.t_prompt_end - slot.t_start).count();
    if (slot.decoding) stats_.generation_seconds += std::chrono::duration<double>(t_end - slot.t_prompt_end).count();
    stats_.active = std::max<int64_t>(0, stats_.active - 1);
    running_.erase(std::find(running_.begin(), running_.end(), slot.job));
  }
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.pending_text += tail;
    job.finish = reason;
    job.error = std::move(error);
    job.done = true;
    job.cv.notify_all();
  }
  slot.job.reset();
  slot.decoding = false;
}

void Worker::emit(Slot& slot, const std::string& text) {
  Job& job = *slot.job;
  std::lock_guard<std::mutex> lock(job.mu);
  job.pending_text += text;
  job.completion_tokens = slot.n;
  job.cv.notify_all();
}

// Emits what cannot be part of a stop string; returns true (the job should finish with kStop) when one is
// complete, the held text then cut before it.
bool Worker::scan(Slot& slot) {
  Job& job = *slot.job;
  size_t cut = std::string::npos;
  const std::string* matched = nullptr;
  // Stop sequences do not cut a constrained output (a forced tool call, a JSON object): the constraint ends it, and a
  // cut call came back as its markup in the text.
  const std::vector<std::string> none;
  const std::vector<std::string>& stops = slot.constraint ? none : job.stop;
  for (const std::string& stop : stops) {
    if (const size_t at = slot.held.find(stop); at < cut) {
      cut = at;
      matched = &stop;
    }
  }
  if (cut != std::string::npos) {
    slot.held.resize(cut);
    std::lock_guard<std::mutex> lock(job.mu);
    job.stop_sequence = *matched;
    job.completion_tokens = slot.n;
    return true;
  }
  const size_t keep = stop_prefix_overlap(slot.held, stops);
  emit(slot, slot.held.substr(0, slot.held.size() - keep));
  slot.held.erase(0, slot.held.size() - keep);
  return false;
}

// Computes the prompt, or (yield_after_chunk) its next --batch chunk, or as much of a prefill sweep (its steps, a
// layer of a chunk each, until a chunk's worth of tokens; the next turn continues the sweep). A stream silent for
// keepalive_seconds_ gets a keep-alive after a chunk or sweep step; a client that left stops the prefill there (the
// computed prefix stays).
// Whether anything besides `self` waits for the worker: another slot's job (decoding or in its prompt), or a queued
// job with an idle slot to go to (a prompt computed whole held every other request back until it ended).
bool Worker::others_wait(const Slot& self) {
  if (std::any_of(slots_.begin(), slots_.end(), [&](const auto& s) { return s.get() != &self && s->job; })) return true;
  const bool idle = std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return !s->job; });
  std::lock_guard<std::mutex> lock(mu_);
  return idle && !queue_.empty();
}

void Worker::prefill_step(Slot& slot) {
  Job& job = *slot.job;
  if (job.cancelled.load()) return finish(slot, FinishReason::kCancelled, {});
  Session& session = *slot.session;
  const SessionStats before = session.stats();
  bool yielded = false;
  const int64_t chunk = engine_.options().n_batch;  // a turn's share: a chunk, or as much of a sweep's steps
  // The job counts as started (its usage known: what the sync reused or restored) once its first sync has decided
  // that, at its first chunk, so that a stream's head (Anthropic's message_start) does not wait for a whole prompt.
  auto start = [&] {
    if (slot.synced_once) return;
    slot.synced_once = true;
    const SessionStats& after = session.stats();
    std::lock_guard<std::mutex> lock(job.mu);
    job.prompt_tokens = int64_t(job.prompt.size());
    job.cached_tokens = (after.reused_tokens - before.reused_tokens) + (after.restored_tokens - before.restored_tokens);
    slot.restored_counted = after.restored_tokens;
    job.started = true;
    job.cv.notify_all();
  };
  const Status synced = session.sync(job.prompt, Logits::kLast, [&](int64_t done, int64_t total) {
    start();
    if (job.cancelled.load()) return false;
    if (job.stream && std::chrono::duration<double>(Clock::now() - slot.last_output).count() >= keepalive_seconds_) {
      slot.last_output = Clock::now();
      std::lock_guard<std::mutex> lock(job.mu);
      ++job.keepalives;
      job.cv.notify_all();
    }
    if (done < total && done >= chunk && others_wait(slot)) {
      yielded = true;
      return false;
    }
    return true;
  });
  start();  // a sync that computed nothing, or failed before its first chunk
  // Blocks restored from the disk KV after the count above (a restore goes block by block, across turns too) are
  // cached tokens as well.
  if (const int64_t restored = session.stats().restored_tokens; restored > slot.restored_counted) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.cached_tokens += restored - slot.restored_counted;
    slot.restored_counted = restored;
  }
  if (!synced.ok() && yielded && !job.cancelled.load()) return;  // the next turn continues it
  slot.t_prompt_end = Clock::now();
  if (!synced.ok() && job.cancelled.load()) return finish(slot, FinishReason::kCancelled, {});
  if (!synced.ok()) return finish(slot, FinishReason::kError, {}, synced.message());
  slot.decoding = true;
  if (!job.output_prefix.empty()) emit(slot, job.output_prefix);
}

// Samples the next token of a decoding slot and emits it: false when that ended the job (finished), else *id is the
// token (not computed yet, unless it is the right guess of a draft).
bool Worker::sample_next(Slot& slot, int32_t* id_out) {
  Job& job = *slot.job;
  Session& session = *slot.session;
  if (job.cancelled.load()) {
    finish(slot, FinishReason::kCancelled, {});
    return false;
  }
  const size_t committed = slot.decoder->committed();
  if (slot.constraint) {
    slot.tokens_left = std::min(job.max_tokens - slot.n, session.n_ctx() - 1 - int64_t(committed));
    slot.closing_forced |= slot.tokens_left <= int64_t(slot.constraint->closing().size());
  }
  // The penalties' history: the tokens generated for this job (OpenAI's presence and frequency penalties).
  const std::span<const int32_t> tokens = slot.decoder->history();
  const size_t generated = std::min(tokens.size(), size_t(slot.n));
  const int32_t id =
      slot.sampler->sample(slot.decoder->logits(), tokens.subspan(tokens.size() - generated), slot.allow);
  if (id < 0) {
    finish(slot, FinishReason::kError, {}, "no token of the vocabulary fits the output constraint");
    return false;
  }
  if (engine_.is_end_of_generation(id)) {
    ++slot.n;  // usage counts the end token too, as vLLM's (its output token ids hold it)
    slot.held += slot.detok->flush();
    scan(slot);
    finish(slot, FinishReason::kStop, std::move(slot.held));
    return false;
  }
  ++slot.n;
  slot.held += slot.detok->push(id);
  slot.last_output = Clock::now();
  if (scan(slot)) {
    finish(slot, FinishReason::kStop, std::move(slot.held));
    return false;
  }
  if (slot.constraint) {
    if (!slot.constraint->feed(engine_.token_bytes(id))) {  // the filter accepted it: a bug if this happens
      finish(slot, FinishReason::kError, {}, "the sampled token does not fit the output constraint");
      return false;
    }
    if (slot.constraint->done()) {
      slot.held += slot.detok->flush();
      if (scan(slot)) {
        finish(slot, FinishReason::kStop, std::move(slot.held));
      } else if (slot.closing_forced) {
        // Closed because max_tokens or the context ran out: a cut answer, reported as the limit. A forced call's
        // suffix stays off, so the cut call comes back as the text it is, never as a call an agent would run.
        finish(slot, FinishReason::kLength, std::move(slot.held));
      } else {
        finish(slot, FinishReason::kStop, slot.held + job.output_suffix);
      }
      return false;
    }
  }
  if (slot.n >= job.max_tokens || int64_t(committed) + 1 >= session.n_ctx()) {
    slot.held += slot.detok->flush();
    if (scan(slot)) {
      finish(slot, FinishReason::kStop, std::move(slot.held));
    } else {
      finish(slot, FinishReason::kLength, std::move(slot.held));
    }
    return false;
  }
  *id_out = id;
  return true;
}

// Samples the next tokens of every decoding slot (ending the jobs that are done): one, and after it every right
// guess of the slot's last drafts, whose rows are computed. The continuing slots' last tokens are computed in one
// batched forward pass, or, for a slot that decodes alone with --lookup, with the drafts prompt lookup finds. The
// sampled token is not computed when its job ends there: the next request's sync recomputes it.
void Worker::decode_step() {
  std::vector<Session*> batch;
  std::vector<int32_t> ids;
  std::vector<Slot*> members;
  for (const std::unique_ptr<Slot>& s : slots_) {
    Slot& slot = *s;
    if (!slot.job || !slot.decoding) continue;
    int32_t id = -1;
    bool going = sample_next(slot, &id);
    while (going && slot.decoder->accept(id)) going = sample_next(slot, &id);
    if (!going) continue;
    batch.push_back(slot.session.get());
    ids.push_back(id);
    members.push_back(&slot);
  }
  if (batch.empty()) return;
  Status s;
  if (Slot& slot = *members[0]; lookup_ > 0 && members.size() == 1) {
    // Drafts for tokens it may still generate (the last one is sampled, never computed).
    s = slot.decoder->step(ids[0], std::min(lookup_, slot.job->max_tokens - slot.n - 1));
  } else {
    s = engine_.step(batch, ids);
  }
  if (!s.ok()) {
    // The batch failed (a read error of some expert, ...) and left every session as it was: each steps alone once,
    // so a transient error or one member's trouble ends only the jobs that fail again (it ended them all).
    if (members.size() == 1) return finish(*members[0], FinishReason::kError, {}, s.message());
    std::fprintf(stderr, "magnetar serve: a decode step of %zu sessions failed (%s): each steps alone\n",
                 members.size(), s.message().c_str());
    for (size_t i = 0; i < members.size(); ++i) {
      if (Status alone = batch[i]->step(ids[i]); !alone.ok()) {
        finish(*members[i], FinishReason::kError, {}, alone.message());
      }
    }
  }
  // The web UI's live view: statistics and expert map refreshed every kPublishEveryTokens tokens of a job.
  for (Slot* slot : members) {
    if (slot->n - slot->published_n >= kPublishEveryTokens) {
      slot->published_n = slot->n;
      publish(slot->n, std::chrono::duration<double>(Clock::now() - slot->t_prompt_end).count());
      break;
    }
  }
}

}  // namespace magnetar::server
