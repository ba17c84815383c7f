// The one thread that owns the engine's Sessions and does all compute (STYLE.md rule 10). HTTP threads build a
// Job (plain data: prompt ids, sampling, limits), submit it, and read its output under the job's own mutex.
// The worker has N slots (--parallel), each a Session that keeps its KV between requests. Queued jobs are taken
// in FIFO order, each into the idle slot whose cached tokens share the longest prefix with its prompt (when that is
// at least half of the shorter of the two; else the least recently used slot), so an agent resending a growing
// history only prefills the new tail and a new conversation does not evict another one's. All decoding slots
// advance together, one token each per batched forward pass (Engine::step: the weights are read once for all);
// a prompt being prefilled while others decode advances one --batch chunk per turn, so streams keep flowing. With
// --lookup, a slot that decodes alone computes its token with prompt lookup drafts (Session::step(id, drafts)) and
// emits every right guess after it in the next turn.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chat/output_constraint.h"
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
  bool ignore_eos = false;        // end-of-generation tokens are never sampled: the output ends at max_tokens, the
                                  // context's end or a stop string (a constrained job never samples them anyway)
  // Structured output (chat/output_constraint.h): when active, every sampled token keeps the generated text in the
  // constrained language, and generation ends (kStop) as soon as the constraint is done.
  chat::ConstraintSpec constraint;
  std::string output_prefix;  // output text already in the prompt (a forced `<tool_call>` opening): emitted first
  std::string output_suffix;  // appended to the output when the constraint is done (the forced call's closing)

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
  uint64_t draft_tokens = 0, drafts_accepted = 0;     // --lookup: drafts computed, and those that were right
  double prompt_seconds = 0, generation_seconds = 0;  // wall time in Session::sync, and in the sampling loop
  int64_t slots = 0;                                  // --parallel
  int64_t active = 0;                                 // jobs in a slot
  int64_t queued = 0;                                 // jobs submitted and not started
  // Engine::expert_stats() as the worker read it after its last job (Engine is not safe to read during a
  // forward, so HTTP threads never call it).
  ExpertStats experts;
  // ---- for the web UI (server/webui.h): read with `experts`, and refreshed every kPublishEveryTokens generated
  // tokens while a job runs, so that its expert map is live during a long answer
  ExpertMap expert_map;  // Engine::expert_map()
  KvDiskStats kv_disk;   // Engine::kv_disk_stats()
  // The running job's (or else the last job's) tokens generated and seconds since its prompt was computed.
  int64_t last_generated_tokens = 0;
  double last_generation_seconds = 0;
};

// How often a running job republishes the engine's statistics (a copy of the expert map: [n_layer * n_expert]).
inline constexpr int64_t kPublishEveryTokens = 16;

class Worker {
 public:
  // `engine` must outlive the worker, which takes `sessions` (of that engine, at least one: the slots) and starts
  // its thread. A streaming job silent for `keepalive_seconds` during its prefill gets a keep-alive
  // (ServerOptions; 0: one after every prefill chunk). `lookup`: ServerOptions::lookup.
  static std::unique_ptr<Worker> start(Engine& engine, std::vector<std::unique_ptr<Session>> sessions,
                                       double keepalive_seconds, int64_t lookup = 0);
  ~Worker();  // stops the thread; queued and running jobs end as kCancelled

  // A job submitted after close() ends at once as kCancelled.
  void submit(std::shared_ptr<Job> job);
  // The server is stopping: queued and running jobs end as kCancelled at their next check (a running prefill within a
  // chunk, a generation before its next token), so that the requests waiting for them return.
  void close();
  // Thread-safe: a copy of the published totals, the disk KV's read now (waiting for the blocks being written).
  WorkerStats stats();

 private:
  struct Slot;
  Worker(Engine& engine, std::vector<std::unique_ptr<Session>> sessions, double keepalive_seconds, int64_t lookup);
  void loop();
  void admit(Slot& slot);
  void prefill_step(Slot& slot);
  bool others_wait(const Slot& self);
  void decode_step();
  bool sample_next(Slot& slot, int32_t* id);
  bool scan(Slot& slot);
  void emit(Slot& slot, const std::string& text);
  void finish(Slot& slot, FinishReason reason, std::string tail, std::string error = {});
  static void finish_unstarted(Job& job);
  // Reads the engine's expert statistics and map (this thread, between forward passes) into stats_ with a job's
  // progress (the disk KV's counts are read by stats()).
  void publish(int64_t generated_tokens, double generation_seconds);

  Engine& engine_;
  const double keepalive_seconds_;
  const int64_t lookup_;
  std::vector<std::unique_ptr<Slot>> slots_;  // touched only by thread_ (and the destructor after it ends)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool closing_ = false;                    // guarded by mu_
  std::vector<std::shared_ptr<Job>> running_;  // the slots' jobs; guarded by mu_ (for close())
  WorkerStats stats_;                       // guarded by mu_ (queued is derived from queue_)
  std::thread thread_;
};

// The slot choice, as a pure function, among idle slots: the one whose tokens share the longest prefix with `prompt`
// among those it holds: whose last prompt it contains (the request continues or repeats it) or whose tokens, answer
// included, it shares at least half of (an edit keeping most of it); else an empty slot (a conversation sharing only
// the beginning, a system prompt, would evict the slot's answer and history); else the one sharing the longest prefix
// with at least half of its last prompt; else the one sharing the longest prefix that is at least half of the shorter
// of its tokens and the prompt (a fork of its conversation: a subagent sharing the system prompt and tools, which would
// otherwise evict a whole conversation); else the least recently used. SIZE_MAX when none is idle.
struct SlotView {
  bool busy = false;
  uint64_t last_used = 0;
  const std::vector<int32_t>* tokens = nullptr;
  size_t prompt = 0;  // how many of `tokens` were its last request's prompt (the rest its answer); 0: all
};
size_t choose_slot(const std::vector<SlotView>& slots, std::span<const int32_t> prompt);

// How many bytes at the end of `text` could be the start of one of `stops` (and so must be held back).
size_t stop_prefix_overlap(const std::string& text, const std::vector<std::string>& stops);

}  // namespace magnetar::server
