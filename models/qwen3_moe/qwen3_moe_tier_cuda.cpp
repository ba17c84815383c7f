// Qwen3 / Qwen3-MoE on a CUDA device, tiered mode (qwen3_moe_cuda.h): the GPU expert pool's acquire and copies, the
// CPU expert lane, and prefill sweeps (a prompt layer by layer over its chunks, so that each layer's experts come up
// once per sweep).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "models/qwen3_moe/qwen3_moe_cuda.h"

namespace magnetar::models::qwen3_cuda {

Status Qwen3Cuda::pool_acquire(int64_t il, std::span<const int32_t> active, std::span<const int32_t> rows,
                               experts::ExpertSource& source, int64_t guess_layer,
                               std::span<const int32_t> guess) const {
  const int64_t X = hp_.n_expert;
  ++tick_;
  misses_.clear();
  lane_.clear();
  hits_.clear();
  for (const int32_t e : active) {
    const int32_t s = slot_of_[size_t(il * X + e)];
    if (s >= 0) {
      slots_[size_t(s)].last_use = tick_;
      policy_->touch(uint32_t(il * X + e), tick_);
      tier_stats_.hits++;
      hits_.push_back(e);
    } else {
      misses_.push_back(e);
    }
  }
  // Each slot's score, once per call (lfu's is an exp() per slot; nothing touched below changes it): an empty slot
  // scores lowest, a slot of the current layer is not evictable (+inf).
  if (!misses_.empty()) {
    slot_score_.resize(slots_.size());
    for (size_t s = 0; s < slots_.size(); ++s) {
      const Slot& sl = slots_[s];
      slot_score_[s] = sl.last_use == tick_ ? INFINITY
                       : sl.layer < 0       ? -1.0
                                            : policy_->score(uint32_t(sl.layer * X + sl.expert), tick_);
    }
  }
  if (cpu_lane_ && !misses_.empty()) {
    // A miss enters the pool only when the policy scores it (before this use) above the lowest-scored expert it
    // could displace; of the others with few rows, the coldest are computed on the CPU (as many as lane_balance_
    // gives; the rest are copied up as every miss is without the lane).
    const double lowest = *std::min_element(slot_score_.begin(), slot_score_.end());
    cold_.clear();
    size_t kept = 0;
    for (const int32_t e : misses_) {
      if (rows[size_t(e)] <= kCpuLaneMaxRows) {
        const double score = policy_->score(uint32_t(il * X + e), tick_);
        if (score <= lowest) {
          cold_.emplace_back(score, e);
          continue;
        }
      }
      misses_[kept++] = e;
    }
    misses_.resize(kept);
    std::stable_sort(cold_.begin(), cold_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const int64_t n_cold = int64_t(cold_.size());
    const int64_t take = lane_balance() ? lane_balance_.lane_count(int64_t(kept) + n_cold, n_cold) : n_cold;
    for (int64_t i = 0; i < n_cold; ++i) (i < take ? lane_ : misses_).push_back(cold_[size_t(i)].second);
  }
  for (const int32_t e : misses_) policy_->touch(uint32_t(il * X + e), tick_);
  for (const int32_t e : lane_) policy_->touch(uint32_t(il * X + e), tick_);
  // A sweep's later chunks find the layer's experts in the pool: the source still counts their uses, as it counts
  // the acquires of chunk-by-chunk calls (its eviction scores and census keep the prompt's popularity for decode).
  if (sweeping_ && !hits_.empty()) source.touch(il, hits_);
  const bool acquire = !misses_.empty() || !lane_.empty();
  if (acquire) {
    const size_t n_copy = misses_.size();
    misses_.insert(misses_.end(), lane_.begin(), lane_.end());  // one acquire for the layer: copies, then the lane
    host_ptrs_.resize(misses_.size());
    ready_.resize(misses_.size());
    source.acquire(il, misses_, host_ptrs_, ready_);
    held_.emplace(source);  // released by settle_copies() once the copies have landed (the lane runs before)
    if (guess_layer >= 0) source.prefetch(guess_layer, guess);
    // The misses already in host memory are copied up while the others are read from disk (one batch each).
    MAGNETAR_CHECK(copy_batches_ == 0);  // settle_copies() ran since the last acquire
    cuda::Stream& copies = tier_overlap() ? copy_stream_ : stream_;
    auto copy_batch = [&](bool in_memory) {
      bool started = false;
      for (size_t i = 0; i < n_copy; ++i) {
        if ((ready_[i] != 0) != in_memory) continue;
        // The lowest-scored slot that this layer's experts do not hold (the pool has >= n_expert slots); an empty
        // slot first, then the least recently used among equals.
        size_t victim = SIZE_MAX;
        for (size_t s = 0; s < slots_.size(); ++s) {
          if (slot_score_[s] == INFINITY) continue;
          if (victim == SIZE_MAX || slot_score_[s] < slot_score_[victim] ||
              (slot_score_[s] == slot_score_[victim] && slots_[s].last_use < slots_[victim].last_use)) {
            victim = s;
          }
        }
        MAGNETAR_CHECK(victim != SIZE_MAX);
        slot_score_[victim] = INFINITY;  // this layer's now
        Slot& slot = slots_[victim];
        if (slot.layer >= 0) {
          slot_of_[size_t(slot.layer * X + slot.expert)] = -1;
          tier_stats_.evictions++;
        }
        slot = {.layer = int32_t(il), .expert = misses_[i], .last_use = tick_};
        slot_of_[size_t(il * X + misses_[i])] = int32_t(victim);
        uint8_t* dst = static_cast<uint8_t*>(pool_.data()) + victim * slot_bytes_;
        if (!started) copy_start_[copy_batches_].record(copies);
        started = true;
        for (int p = 0; p < 3; ++p) {
          const size_t bytes = size_t(layout_->extent(il, misses_[i], experts::Part(p)).bytes);
          copies.copy(dst, host_ptrs_[i].part[p], bytes);
          dst += part_cap_[p];
          tier_stats_.bytes_h2d += bytes;
        }
        tier_stats_.misses++;
      }
      if (started) copy_end_[copy_batches_++].record(copies);
    };
    if (copy_ready_first()) copy_batch(true);
    if (Status waited = source.wait(host_ptrs_); !waited.ok()) {
      misses_.clear();  // settle_copies still waits for the copies queued so far, but times none for the balance
      return waited;
    }
    if (!copy_ready_first()) copy_batch(true);
    copy_batch(false);
    lane_ptrs_.assign(host_ptrs_.begin() + std::ptrdiff_t(n_copy), host_ptrs_.end());
    misses_.resize(n_copy);
  }
  if (!acquire && guess_layer >= 0) source.prefetch(guess_layer, guess);
  for (const int32_t e : active) {
    const int32_t s = slot_of_[size_t(il * X + e)];
    for (int p = 0; p < 3; ++p) pool_ptrs_[size_t(e) * 3 + size_t(p)] = nullptr;  // the CPU lane's: not on the GPU
    if (s < 0) continue;
    const uint8_t* base = static_cast<uint8_t*>(pool_.data()) + size_t(s) * slot_bytes_;
    pool_ptrs_[size_t(e) * 3] = base;
    pool_ptrs_[size_t(e) * 3 + 1] = base + part_cap_[0];
    pool_ptrs_[size_t(e) * 3 + 2] = base + part_cap_[0] + part_cap_[1];
  }
  return Status();
}

void Qwen3Cuda::settle_copies() const {
  if (held_) copy_stream_.synchronize();  // already done when stream_ waited for the copies and was synchronized
  double seconds = 0;
  for (int b = 0; b < copy_batches_; ++b) seconds += cuda::Event::seconds_between(copy_start_[b], copy_end_[b]);
  tier_stats_.h2d_seconds += seconds;
  if (copy_batches_ > 0) lane_balance_.copies_ran(int64_t(misses_.size()), seconds);  // the last acquire's copies
  copy_batches_ = 0;
  held_.reset();
}

void Qwen3Cuda::run_cpu_lane(cpu::ThreadPool& pool, const DevLayer& L, int64_t n) const {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t E = hp_.n_embd, F = hp_.n_ff_exp, X = hp_.n_expert, R = n * hp_.n_expert_used;
  const int32_t* h_x_rows = reinterpret_cast<const int32_t*>(h_items_.as<GroupItem>() + R + X);
  const std::vector<int32_t>& begin = expert_begin_;
  const std::vector<int32_t>& count = expert_rows_;
  h_xn_ready_.synchronize();
  // The tokens' input prepared for the expert weights once, then gathered per row (rows in grouped order).
  const cpu::PreparedInput xt = cpu::prepare_input(pool, L.exp_type, h_xn_.as<float>(), E, E, n, lane_xt_.data());
  float* gate = lane_gu_.data();
  float* up = gate + R * F;
  std::vector<cpu::MatmulJob>& jobs = lane_jobs_;
  jobs.clear();
  for (size_t j = 0; j < lane_.size(); ++j) {
    const int32_t r0 = begin[size_t(lane_[j])], cnt = count[size_t(lane_[j])];
    uint8_t* xg = lane_xg_.data() + size_t(r0) * xt.row_bytes;
    for (int32_t r = 0; r < cnt; ++r) {
      std::memcpy(xg + size_t(r) * xt.row_bytes,
                  static_cast<const uint8_t*>(xt.data) + size_t(h_x_rows[r0 + r]) * xt.row_bytes, xt.row_bytes);
    }
    const cpu::PreparedInput x{.data = xg, .row_bytes = xt.row_bytes, .n_tok = cnt, .is_float = xt.is_float};
    jobs.push_back({.w = lane_ptrs_[j].part[0], .type = L.exp_type, .n_in = E, .n_out = F, .x = x,
                    .y = gate + int64_t(r0) * F, .ldy = F});
    jobs.push_back({.w = lane_ptrs_[j].part[1], .type = L.exp_type, .n_in = E, .n_out = F, .x = x,
                    .y = up + int64_t(r0) * F, .ldy = F});
  }
  cpu::matmul(pool, jobs);
  jobs.clear();
  const size_t h_row = cpu::prepare_input_bytes(L.down_type, F, 1);
  float* down = h_down_.as<float>();
  for (size_t j = 0; j < lane_.size(); ++j) {
    const int32_t r0 = begin[size_t(lane_[j])], cnt = count[size_t(lane_[j])];
    cpu::swiglu(pool, gate + int64_t(r0) * F, up + int64_t(r0) * F, int64_t(cnt) * F);
    const cpu::PreparedInput h = cpu::prepare_input(pool, L.down_type, gate + int64_t(r0) * F, F, F, cnt,
                                                    lane_h_.data() + size_t(r0) * h_row);
    jobs.push_back({.w = lane_ptrs_[j].part[2], .type = L.down_type, .n_in = F, .n_out = E, .x = h,
                    .y = down + int64_t(r0) * E, .ldy = E});
  }
  cpu::matmul(pool, jobs);
  for (const int32_t e : lane_) {
    const int32_t r0 = begin[size_t(e)], cnt = count[size_t(e)];
    stream_.copy(down_.as<float>() + int64_t(r0) * E, down + int64_t(r0) * E, size_t(cnt) * size_t(E) * sizeof(float));
    tier_stats_.cpu_rows += uint64_t(cnt);
  }
  tier_stats_.cpu_experts += lane_.size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tier_stats_.cpu_seconds += seconds;
  lane_balance_.lane_ran(int64_t(lane_.size()), seconds);
}

Status Qwen3Cuda::sweep(cpu::ThreadPool& pool, const ForwardArgs& args) const {
  const auto t_call = std::chrono::steady_clock::now();
  const int64_t n = args.n_tok, E = hp_.n_embd, B = n_batch_, chunks = (n + B - 1) / B;
  const SeqSpan& seq = args.seqs[0];
  MAGNETAR_CHECK(args.seq_logits.size() <= 1 && (args.all_logits || args.seq_logits.size() == 1 || args.logits));
  SweepCursor whole;
  SweepCursor& at = args.sweep ? *args.sweep : whole;
  at.begin(int64_t(layers_.size()), chunks);
  // sweep_x_ / sweep_p_ hold one sweep: a continued one must be the sweep that filled them.
  if (at.step == 0) {
    sweep_of_ = {seq.kv, seq.pos0, n};
  } else if (sweep_of_ != std::tuple(seq.kv, seq.pos0, n)) {
    return Status::error("a paused prefill sweep was continued after another sweep replaced its state");
  }
  sweeping_ = true;
  // However the call ends (done, paused or failed), the next forward (another session's) writes the pinned h_x_ and
  // h_positions_ at once: the copies that read them must be done.
  struct EndSweep {
    bool& on;
    cuda::Stream& stream;
    ~EndSweep() {
      stream.synchronize();
      on = false;
    }
  } end_sweep{sweeping_, stream_};
  float* sweep_x = sweep_x_.as<float>();
  float* sweep_p = sweep_p_.as<float>();
  const size_t row = size_t(E) * sizeof(float);
  if (args.profile) device_start_.record(stream_);
  double embed_seconds = 0;
  while (at.step < at.steps) {
    if (at.at_embeddings()) {
      // Embeddings, a chunk at a time through the pinned h_x_ (the copy before must have read it).
      for (int64_t c = 0; c < n; c += B) {
        const int64_t m = std::min(B, n - c);
        stream_.synchronize();
        embed_seconds += embed_on_host(args.tokens + c, m);
        stream_.copy(sweep_x + c * E, h_x_.as<float>(), size_t(m) * row);
      }
    } else if (!at.at_head()) {
      // Layer by layer, chunk by chunk: a chunk's attention reads the rows the chunks before it stored at this layer.
      const int64_t il = at.layer(chunks), c = at.chunk(chunks) * B, m = std::min(B, n - c);
      const SeqSpan chunk{.kv = seq.kv, .pos0 = seq.pos0 + c, .n_tok = m};
      ForwardArgs a = args;
      a.tokens = args.tokens + c;
      a.n_tok = m;
      a.seqs = {&chunk, 1};
      stream_.synchronize();  // h_positions_ was read by the chunk before's copy
      stage_positions(a.seqs);
      upload_positions(a.seqs, m);
      float* x = x_.as<float>();
      float* x_other = x2_.as<float>();
      stream_.copy(x, sweep_x + c * E, size_t(m) * row);
      if (il > 0) stream_.copy(proj_.data(), sweep_p + c * E, size_t(m) * row);
      bool combine = false;
      MAGNETAR_RETURN_IF_ERROR(layer(pool, a, size_t(il), m, x, x_other, combine));
      stream_.copy(sweep_x + c * E, x, size_t(m) * row);
      stream_.copy(sweep_p + c * E, proj_.data(), size_t(m) * row);
      if (args.routing) count_routes(*args.routing, il, m);  // moe_ffn synchronized after the ids' copy
    } else {
      // The final norm and the head: every token's row, or the last one's, chunk by chunk as single calls compute
      // them.
      for (int64_t c = args.all_logits ? 0 : (n - 1) / B * B; c < n; c += B) {
        const int64_t m = std::min(B, n - c);
        stream_.copy(x_.data(), sweep_x + c * E, size_t(m) * row);
        stream_.copy(proj_.data(), sweep_p + c * E, size_t(m) * row);
        MAGNETAR_RETURN_IF_ERROR(add_norm(x_.as<float>(), output_norm_.f32(), quant::Type::F32, m, false));
        const float* xn = xn_.as<float>();
        MAGNETAR_RETURN_IF_ERROR(args.all_logits ? head(args, xn, m, c) : head(args, xn + (m - 1) * E, 1, 0));
      }
      seq.kv->wrote_device(seq.pos0, seq.pos0 + n);
    }
    if (++at.step < at.steps && args.pause && (*args.pause)()) break;
  }
  if (args.profile) {
    device_end_.record(stream_);
    stream_.synchronize();
    add_profile(*args.profile, t_call, embed_seconds);
  }
  return Status();
}

}  // namespace magnetar::models::qwen3_cuda
