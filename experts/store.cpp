#include "experts/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/check.h"

namespace magnetar::experts {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kAlign = 4096;             // O_DIRECT offset, length and buffer alignment
constexpr size_t kMaxIov = 64;                // records per coalesced read
constexpr uint64_t kMaxReadBytes = 64ull << 20;
constexpr uint64_t kMaxGapBytes = 16ull << 20;  // StoreOptions::merge_gap_bytes is capped here
// A prefetch only takes a free slot or one no token used in the last kPrefetchColdTokens tokens. With 1 (only
// the current token's entries protected) the 1.5 GiB arm of docs/benchmarks/2026-11-30-expert-streaming.md
// lost 10% decode speed to prefetches evicting entries the next tokens needed.
constexpr uint64_t kPrefetchColdTokens = 16;

uint64_t align_down(uint64_t v) { return v / kAlign * kAlign; }
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Standard layout: the 4 KiB-aligned span a part is read as.
struct Span {
  uint64_t start, bytes, needed;
};
Span part_span(const Extent& x) {
  const uint64_t start = align_down(x.offset);
  return {start, align_up(x.offset + x.bytes) - start, x.offset + x.bytes - start};
}

// Slot geometry: slab size and, for the standard layout, where each part's span starts in a slot.
uint64_t slot_geometry(const ExpertLayout& layout, uint64_t part_base[kParts]) {
  if (layout.packed()) {
    uint64_t slab = 0;
    for (int64_t l = 0; l < layout.n_layer(); ++l) {
      if (layout.has_experts(l)) slab = std::max(slab, layout.record(l, 0)->bytes);
    }
    for (int p = 0; p < kParts; ++p) part_base[p] = 0;
    return slab;
  }
  uint64_t widest[kParts] = {};
  for (int64_t l = 0; l < layout.n_layer(); ++l) {
    if (!layout.has_experts(l)) continue;
    for (int64_t e = 0; e < layout.n_expert(); ++e) {
      for (int p = 0; p < kParts; ++p) widest[p] = std::max(widest[p], part_span(layout.extent(l, e, Part(p))).bytes);
    }
  }
  uint64_t base = 0;
  for (int p = 0; p < kParts; ++p) {
    part_base[p] = base;
    base += widest[p];
  }
  return base;
}

}  // namespace

LayerStats StoreStats::total() const {
  LayerStats t;
  for (const LayerStats& s : layers) {
    t.hits += s.hits;
    t.inflight_hits += s.inflight_hits;
    t.misses += s.misses;
    t.reads += s.reads;
    t.bytes_read += s.bytes_read;
    t.gap_bytes += s.gap_bytes;
    t.read_seconds += s.read_seconds;
    t.read_seconds_max = std::max(t.read_seconds_max, s.read_seconds_max);
    t.wait_seconds += s.wait_seconds;
    t.prefetch_issued += s.prefetch_issued;
    t.prefetch_used += s.prefetch_used;
    t.prefetch_wasted += s.prefetch_wasted;
    t.predicted += s.predicted;
    t.acquired += s.acquired;
  }
  return t;
}

uint64_t StreamedExperts::slab_bytes(const ExpertLayout& layout) {
  uint64_t base[kParts];
  return slot_geometry(layout, base);
}

StreamedExperts::StreamedExperts(const gguf::Model& model, const ExpertLayout& layout, const StoreOptions& options)
    : model_(model), layout_(layout), options_(options) {}

Result<std::unique_ptr<StreamedExperts>> StreamedExperts::open(const gguf::Model& model, const ExpertLayout& layout,
                                                               const StoreOptions& options) {
  std::unique_ptr<StreamedExperts> store(new StreamedExperts(model, layout, options));
  MAGNETAR_RETURN_IF_ERROR(store->init());
  return store;
}

Status StreamedExperts::init() {
  for (int64_t l = 0; l < layout_.n_layer(); ++l) n_moe_layers_ += layout_.has_experts(l) ? 1 : 0;
  if (n_moe_layers_ == 0) return Status::error("the model has no routed experts to stream");
  const size_t n_keys = size_t(layout_.n_layer() * layout_.n_expert());
  policy_ = make_policy(options_.policy, n_keys, std::max(1.0, options_.half_life_tokens * double(n_moe_layers_)));
  if (!policy_) {
    return Status::error(format("unknown cache policy '%s' (known: %s)", options_.policy.c_str(), kPolicyNames));
  }
  std::string why;
  if (options_.use_uring) reader_ = make_uring_reader(options_.queue_depth, &why);
  if (!reader_) {
    if (options_.use_uring) std::fprintf(stderr, "magnetar: io_uring unavailable (%s): reading with pread\n", why.c_str());
    reader_ = make_pread_reader(std::max(1, options_.pread_threads));
  }
  direct_ = options_.direct;
  for (const auto& shard : model_.shards()) {
    int fd = direct_ ? ::open(shard->path().c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0 && direct_) direct_ = false;  // e.g. tmpfs: EINVAL; fall back to buffered reads for all shards
    if (fd < 0) fd = ::open(shard->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::error(format("%s: cannot open: %s", shard->path().c_str(), std::strerror(errno)));
    fds_.push_back(fd);
  }
  if (!direct_) {  // reopen any shard opened with O_DIRECT before the fallback, so all read alike
    for (size_t i = 0; i < fds_.size(); ++i) {
      if ((::fcntl(fds_[i], F_GETFL) & O_DIRECT) != 0) ::fcntl(fds_[i], F_SETFL, ::fcntl(fds_[i], F_GETFL) & ~O_DIRECT);
    }
  }
  slab_bytes_ = slot_geometry(layout_, part_base_);
  const uint64_t n_slots = slab_bytes_ ? options_.cache_bytes / slab_bytes_ : 0;
  if (n_slots < uint64_t(layout_.n_expert())) {
    return Status::error(format("an expert cache of %.2f GiB holds %llu experts of %.2f MiB; one layer's forward "
                                "may need all %lld of a layer's experts at once",
                                double(options_.cache_bytes) / double(1ull << 30), (unsigned long long)n_slots,
                                double(slab_bytes_) / double(1 << 20), (long long)layout_.n_expert()));
  }
  pool_bytes_ = n_slots * slab_bytes_;
  // MAP_POPULATE: the memory is committed (and faulted in) here, at load, not by the first reads of the decode
  // path. Measured on the CPU box: first touch costs ~2.2 s per GiB there (the VM's host backs pages lazily),
  // which would otherwise land inside the first minute of decoding.
  const Clock::time_point t_pool = Clock::now();
  void* pool = ::mmap(nullptr, pool_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (pool == MAP_FAILED) {
    return Status::error(format("cannot reserve %.2f GiB for the expert cache: %s",
                                double(pool_bytes_) / double(1ull << 30), std::strerror(errno)));
  }
  pool_ = static_cast<uint8_t*>(pool);
  pool_seconds_ = std::chrono::duration<double>(Clock::now() - t_pool).count();
  slots_.resize(n_slots);
  if (options_.merge_gap_bytes == kMeasureGap) {
    if (Status s = calibrate_gap(); !s.ok()) {  // a measurement: the reads that matter fail (or not) on their own
      gap_buffer_bytes_ = 0;
      std::fprintf(stderr, "magnetar: warning: %s; reads are merged across adjacent records only\n",
                   s.message().c_str());
    }
  } else {
    gap_buffer_bytes_ = align_down(std::min(options_.merge_gap_bytes, kMaxGapBytes));
  }
  if (gap_buffer_bytes_ > 0) {
    gap_buffer_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, gap_buffer_bytes_));
    if (!gap_buffer_) return Status::error("cannot allocate the expert reads' gap buffer");
  }
  free_.reserve(n_slots);
  for (uint64_t s = n_slots; s-- > 0;) free_.push_back(uint32_t(s));
  where_.assign(n_keys, -1);
  hinted_.resize(size_t(layout_.n_layer()));
  stats_.layers.resize(size_t(layout_.n_layer()));
  pinned_.reserve(size_t(layout_.n_expert()));

  census_delta_ = {.n_layer = layout_.n_layer(), .n_expert = layout_.n_expert(), .counts = std::vector<uint64_t>(n_keys)};
  census_seen_ = census_delta_;
  census_saved_ = Clock::now();
  if (!options_.census_path.empty()) {
    identity_ = model_identity(model_);
    census_open_ = true;
    Result<Census> loaded = load_census(options_.census_path, identity_, layout_.n_layer(), layout_.n_expert());
    if (loaded.ok()) {
      census_seen_ = std::move(loaded).value();
    } else {
      std::fprintf(stderr, "magnetar: ignoring the census: %s\n", loaded.status().message().c_str());
    }
    if (options_.warm_start) MAGNETAR_RETURN_IF_ERROR(warm_start());
  }
  return Status();
}

StreamedExperts::~StreamedExperts() {
  std::vector<Completion> drain;
  while (reader_ && reader_->in_flight() > 0) reader_->reap(1, drain);
  if (census_open_) {
    if (Status s = save_census(/*wait=*/true); !s.ok()) std::fprintf(stderr, "magnetar: %s\n", s.message().c_str());
  }
  reader_.reset();
  for (int fd : fds_) ::close(fd);
  if (pool_) ::munmap(pool_, pool_bytes_);
  std::free(gap_buffer_);
}

ExpertPtrs StreamedExperts::pointers(uint32_t slot) const {
  const Slot& s = slots_[slot];
  const int64_t layer = s.key / layout_.n_expert(), expert = s.key % layout_.n_expert();
  ExpertPtrs ptrs;
  const uint8_t* base = slot_data(slot);
  if (layout_.packed()) {
    const uint64_t record = layout_.record(layer, expert)->offset;
    for (int p = 0; p < kParts; ++p) ptrs.part[p] = base + (layout_.extent(layer, expert, Part(p)).offset - record);
  } else {
    for (int p = 0; p < kParts; ++p) {
      const Extent x = layout_.extent(layer, expert, Part(p));
      ptrs.part[p] = base + part_base_[p] + (x.offset - align_down(x.offset));
    }
  }
  return ptrs;
}

void StreamedExperts::build_victims(bool for_prefetch) {
  victims_.clear();
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.state != State::kReady || slot.pins > 0) continue;
    if (for_prefetch && slot.last_use > 0 && tick_ - slot.last_use < kPrefetchColdTokens * uint64_t(n_moe_layers_)) {
      continue;
    }
    victims_.emplace_back(policy_->score(slot.key, tick_), s);
  }
  // Descending (score, slot): the back is the lowest score, the lowest slot among equals (the scan's choice before).
  std::sort(victims_.begin(), victims_.end(), std::greater<>());
  victims_for_ = for_prefetch ? 1 : 0;
}

uint32_t StreamedExperts::allocate(bool for_prefetch) {
  if (!free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  // The call's candidates; once they are used up, scored again (a read may have landed since: a new candidate).
  for (int pass = victims_for_ == int(for_prefetch) ? 0 : 1; pass < 2; ++pass) {
    if (pass == 1) build_victims(for_prefetch);
    while (!victims_.empty()) {
      const uint32_t s = victims_.back().second;
      victims_.pop_back();
      if (slots_[s].state != State::kReady || slots_[s].pins > 0) continue;  // taken in this call since
      evict(s);
      return s;
    }
  }
  return UINT32_MAX;
}

void StreamedExperts::evict(uint32_t slot) {
  Slot& s = slots_[slot];
  where_[s.key] = -1;
  if (s.prefetched) stats_.layers[s.key / layout_.n_expert()].prefetch_wasted++;
  ++stats_.evictions;
  s = Slot{};
}

void StreamedExperts::submit_op(uint32_t shard, uint64_t offset, std::vector<iovec>& iov, std::vector<uint32_t> slots,
                                std::vector<Fixup> fixups, uint64_t needed, uint64_t gap_bytes, int64_t layer) {
  uint32_t tag;
  if (free_ops_.empty()) {
    tag = uint32_t(ops_.size());
    ops_.emplace_back();
  } else {
    tag = free_ops_.back();
    free_ops_.pop_back();
  }
  Op& op = ops_[tag];
  op.slots = std::move(slots);
  op.fixups = std::move(fixups);
  op.bytes_needed = needed;
  op.gap_bytes = gap_bytes;
  op.layer = layer;
  op.shard = shard;
  op.busy = true;
  stats_.layers[size_t(layer)].reads++;
  reader_->submit(fds_[shard], offset, iov, tag);
  iov.clear();
}

void StreamedExperts::read_slots(int64_t layer, std::vector<uint32_t>& slots) {
  if (slots.empty()) return;
  const int64_t X = layout_.n_expert();
  // One piece per record (packed) or per part slice widened to 4 KiB (standard), in file order.
  struct Piece {
    uint32_t shard, slot;
    uint64_t offset, bytes, needed;
    uint8_t* dst;
  };
  std::vector<Piece> pieces;
  pieces.reserve(slots.size() * (layout_.packed() ? 1 : kParts));
  for (const uint32_t s : slots) {
    const int64_t e = slots_[s].key % X;
    if (layout_.packed()) {
      const Extent r = *layout_.record(layer, e);
      pieces.push_back({r.shard, s, r.offset, r.bytes, r.bytes, slot_data(s)});
      slots_[s].pending = 1;
    } else {
      for (int p = 0; p < kParts; ++p) {
        const Extent x = layout_.extent(layer, e, Part(p));
        const Span span = part_span(x);
        pieces.push_back({x.shard, s, span.start, span.bytes, span.needed, slot_data(s) + part_base_[p]});
      }
      slots_[s].pending = kParts;
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.offset < b.offset;
  });
  // Greedy runs: the next piece joins when it starts at the run's end, inside the run's last page (a shared
  // page: read once, copied at completion), or after a gap the scratch buffer takes, up to kMaxReadBytes.
  // (Capping runs at 8x the gap limit, so that the queue would run more reads in parallel, was measured and
  // dropped: decode 12-19% slower on the CPU box, 0-12% on the GPU host; see
  // docs/benchmarks/2026-11-30-expert-streaming.md.)
  std::vector<iovec> iov;
  size_t i = 0;
  while (i < pieces.size()) {
    const Piece& first = pieces[i];
    std::vector<uint32_t> run_slots;
    std::vector<Fixup> fixups;
    uint64_t end = first.offset, needed = 0, gaps = 0;
    const Piece* prev = nullptr;
    while (i < pieces.size()) {
      const Piece& q = pieces[i];
      uint64_t skip = 0;  // bytes of q already read into prev's buffer (a shared page)
      if (prev) {
        if (q.shard != first.shard || q.offset + kAlign < end || q.offset + q.bytes <= end) break;
        const uint64_t gap = q.offset > end ? q.offset - end : 0;
        skip = q.offset < end ? end - q.offset : 0;
        if (gap > gap_buffer_bytes_ || iov.size() + 2 > kMaxIov ||
            end + gap + q.bytes - skip - first.offset > kMaxReadBytes) {
          break;
        }
        if (gap > 0) iov.push_back({gap_buffer_, gap});
        if (skip > 0) fixups.push_back({prev->dst + (q.offset - prev->offset), q.dst, skip});
        gaps += gap;
      }
      iov.push_back({q.dst + skip, q.bytes - skip});
      run_slots.push_back(q.slot);
      needed = q.offset + q.needed - first.offset;
      end = q.offset + q.bytes;
      prev = &q;
      ++i;
    }
    submit_op(first.shard, first.offset, iov, std::move(run_slots), std::move(fixups), needed, gaps, layer);
  }
  slots.clear();
}

void StreamedExperts::pump(size_t min) {
  done_.clear();
  reader_->reap(min, done_);
  for (const Completion& c : done_) {
    Op& op = ops_[c.tag];
    LayerStats& st = stats_.layers[size_t(op.layer)];
    const bool ok = c.result >= 0 && uint64_t(c.result) >= op.bytes_needed;
    if (ok) {
      for (const Fixup& f : op.fixups) std::memcpy(f.dst, f.src, f.bytes);
      st.bytes_read += uint64_t(c.result);
      st.gap_bytes += op.gap_bytes;
      st.read_seconds += c.seconds;
      st.read_seconds_max = std::max(st.read_seconds_max, c.seconds);
    } else if (io_error_.ok()) {
      const std::string& path = model_.shards()[op.shard]->path();
      io_error_ = c.result < 0 ? Status::error(format("%s: read failed: %s", path.c_str(), std::strerror(int(-c.result))))
                               : Status::error(format("%s: short read (%lld of %llu bytes)", path.c_str(),
                                                      (long long)c.result, (unsigned long long)op.bytes_needed));
    }
    for (const uint32_t s : op.slots) {
      Slot& slot = slots_[s];
      if (!ok) slot.failed = true;
      if (--slot.pending > 0) continue;
      if (!slot.failed) {
        slot.state = State::kReady;
        continue;
      }
      // A failed read: forget the entry; a pinned slot goes back to the free list at release().
      where_[slot.key] = -1;
      const uint16_t pins = slot.pins;
      slot = Slot{};
      slot.pins = pins;
      if (pins == 0) free_.push_back(s);
    }
    op.busy = false;
    free_ops_.push_back(uint32_t(c.tag));
  }
}

void StreamedExperts::acquire(int64_t layer, std::span<const int32_t> experts, std::span<ExpertPtrs> ptrs,
                              std::span<uint8_t> ready) {
  victims_for_ = -1;  // scores may have changed since the last call
  MAGNETAR_CHECK(layer_ < 0 && layout_.has_experts(layer));
  MAGNETAR_CHECK(ptrs.size() == experts.size() && ready.size() == experts.size());
  layer_ = layer;
  ++tick_;
  pinned_.clear();
  pump(0);
  LayerStats& st = stats_.layers[size_t(layer)];
  std::vector<int32_t>& hint = hinted_[size_t(layer)];
  if (!hint.empty()) {
    st.acquired += experts.size();
    for (const int32_t e : experts) st.predicted += std::find(hint.begin(), hint.end(), e) != hint.end() ? 1 : 0;
    hint.clear();
  }
  std::vector<uint32_t>& misses = miss_scratch_;
  misses.clear();
  pinned_.assign(experts.size(), UINT32_MAX);  // pinned_[i]: experts[i]'s slot
  auto pin = [&](size_t i, int32_t s) {
    Slot& slot = slots_[size_t(s)];
    slot.pins++;
    slot.last_use = tick_;
    pinned_[i] = uint32_t(s);
    ready[i] = slot.state == State::kReady ? 1 : 0;
    if (ready[i]) ptrs[i] = pointers(uint32_t(s));
  };
  // The experts already in the cache (ready or being read) are pinned first, so that no miss below evicts one that
  // this call asks for further on.
  for (size_t i = 0; i < experts.size(); ++i) {
    MAGNETAR_CHECK(experts[i] >= 0 && experts[i] < layout_.n_expert());
    const uint32_t key = uint32_t(layer * layout_.n_expert() + experts[i]);
    const int32_t s = where_[key];
    if (s < 0) continue;
    count_use(key);
    Slot& slot = slots_[size_t(s)];
    if (slot.prefetched) {
      st.prefetch_used++;
      slot.prefetched = false;
    }
    if (slot.state == State::kReady) {
      st.hits++;
    } else {
      st.inflight_hits++;
    }
    pin(i, s);
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (pinned_[i] != UINT32_MAX) continue;
    const uint32_t key = uint32_t(layer * layout_.n_expert() + experts[i]);
    count_use(key);
    if (const int32_t s = where_[key]; s >= 0) {  // the same expert twice in the call: read once
      st.inflight_hits++;
      pin(i, s);
      continue;
    }
    uint32_t fresh = allocate(false);
    while (fresh == UINT32_MAX) {                // every slot pinned or loading: wait for a prefetch read to land
      MAGNETAR_CHECK(reader_->in_flight() > 0);  // open() guarantees n_slots >= n_expert
      pump(1);
      fresh = allocate(false);
    }
    slots_[fresh].key = key;
    slots_[fresh].state = State::kLoading;
    where_[key] = int32_t(fresh);
    misses.push_back(fresh);
    st.misses++;
    pin(i, int32_t(fresh));
  }
  read_slots(layer, misses);
}

Status StreamedExperts::wait(std::span<ExpertPtrs> ptrs) {
  MAGNETAR_CHECK(layer_ >= 0 && ptrs.size() == pinned_.size());
  const Clock::time_point t0 = Clock::now();
  for (;;) {
    bool all = true, failed = false;
    for (const uint32_t s : pinned_) {
      all = all && slots_[s].state == State::kReady;
      failed = failed || slots_[s].state == State::kFree;
    }
    if (all) break;
    if (failed) {
      Status error = io_error_.ok() ? Status::error("an expert read failed") : io_error_;
      io_error_ = Status();
      return error;
    }
    pump(1);
  }
  stats_.layers[size_t(layer_)].wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  for (size_t i = 0; i < pinned_.size(); ++i) ptrs[i] = pointers(pinned_[i]);
  return Status();
}

void StreamedExperts::release() {
  if (layer_ < 0) return;
  for (const uint32_t s : pinned_) {
    Slot& slot = slots_[s];
    MAGNETAR_CHECK(slot.pins > 0);
    if (--slot.pins == 0 && slot.state == State::kFree) free_.push_back(s);
  }
  pinned_.clear();
  layer_ = -1;
  maybe_save_census();
}

void StreamedExperts::touch(int64_t layer, std::span<const int32_t> experts) {
  MAGNETAR_CHECK(layer >= 0 && layer < layout_.n_layer());
  for (const int32_t e : experts) {
    MAGNETAR_CHECK(e >= 0 && e < layout_.n_expert());
    count_use(uint32_t(layer * layout_.n_expert() + e));
  }
}

void StreamedExperts::prefetch(int64_t layer, std::span<const int32_t> experts) {
  victims_for_ = -1;
  if (layer < 0 || layer >= layout_.n_layer() || !layout_.has_experts(layer)) return;
  hinted_[size_t(layer)].assign(experts.begin(), experts.end());
  std::vector<uint32_t>& fresh = prefetch_scratch_;
  fresh.clear();
  LayerStats& st = stats_.layers[size_t(layer)];
  for (const int32_t e : experts) {
    if (e < 0 || e >= layout_.n_expert()) continue;  // a hint, not a request: an id out of range is ignored
    const uint32_t key = uint32_t(layer * layout_.n_expert() + e);
    if (where_[key] >= 0) continue;
    const uint32_t s = allocate(true);
    if (s == UINT32_MAX) break;
    slots_[s].key = key;
    slots_[s].state = State::kLoading;
    slots_[s].prefetched = true;
    where_[key] = int32_t(s);
    fresh.push_back(s);
    st.prefetch_issued++;
  }
  read_slots(layer, fresh);
}

Status StreamedExperts::calibrate_gap() {
  // Offsets spread over the experts of every MoE layer (first shard holding them), 4 KiB-aligned.
  std::vector<Extent> spots;
  for (int64_t l = 0; l < layout_.n_layer(); ++l) {
    if (!layout_.has_experts(l)) continue;
    for (int64_t e = 0; e < layout_.n_expert(); e += std::max<int64_t>(1, layout_.n_expert() / 4)) {
      spots.push_back(layout_.extent(l, e, Part::kGate));
    }
  }
  constexpr int kSmall = 64;
  constexpr uint64_t kLarge = 16ull << 20;
  const auto run = [&](int n, uint64_t bytes) -> Result<double> {
    const Clock::time_point t0 = Clock::now();
    std::vector<iovec> iov(1);
    for (int i = 0; i < n; ++i) {
      const Extent& x = spots[size_t(i) * 7919 % spots.size()];
      iov[0] = {pool_ + (uint64_t(i) * bytes) % (pool_bytes_ - bytes + 1) / kAlign * kAlign, bytes};
      reader_->submit(fds_[x.shard], align_down(x.offset), iov, uint64_t(i));
    }
    std::vector<Completion> done;
    while (done.size() < size_t(n)) reader_->reap(1, done);
    for (const Completion& c : done) {
      if (c.result <= 0) {
        return Status::error(format("%s: measuring the disk: a read failed (%s)", model_.shards()[0]->path().c_str(),
                                    c.result < 0 ? std::strerror(int(-c.result)) : "end of file"));
      }
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const uint64_t large = std::min(kLarge, align_down(pool_bytes_ / 4));
  if (spots.empty() || large < kAlign) return Status();
  MAGNETAR_ASSIGN_OR_RETURN(const double small_seconds, run(kSmall, kAlign));
  MAGNETAR_ASSIGN_OR_RETURN(const double large_seconds, run(4, large));
  request_seconds_ = small_seconds / kSmall;
  bandwidth_ = double(4 * large) / std::max(large_seconds, 1e-9);
  gap_buffer_bytes_ = align_down(std::min(uint64_t(request_seconds_ * bandwidth_), kMaxGapBytes));
  return Status();
}

Status StreamedExperts::warm_start() {
  std::vector<uint32_t> keys;
  for (uint32_t k = 0; k < census_seen_.counts.size(); ++k) {
    if (census_seen_.counts[k] > 0) keys.push_back(k);
  }
  if (keys.empty()) return Status();
  const Clock::time_point t0 = Clock::now();
  std::stable_sort(keys.begin(), keys.end(), [&](uint32_t a, uint32_t b) {
    return census_seen_.counts[a] > census_seen_.counts[b];
  });
  keys.resize(std::min(keys.size(), slots_.size()));
  std::sort(keys.begin(), keys.end());  // layer by layer, expert order = file order in both layouts
  const uint64_t bytes_before = stats_.total().bytes_read;
  std::vector<uint32_t> batch;
  for (size_t i = 0; i < keys.size();) {
    const int64_t layer = keys[i] / layout_.n_expert();
    for (; i < keys.size() && int64_t(keys[i] / layout_.n_expert()) == layer; ++i) {
      const uint32_t s = free_.back();
      free_.pop_back();
      slots_[s].key = keys[i];
      slots_[s].state = State::kLoading;
      where_[keys[i]] = int32_t(s);
      policy_->touch(keys[i], 0);
      batch.push_back(s);
    }
    read_slots(layer, batch);
  }
  while (reader_->in_flight() > 0) pump(1);
  if (!io_error_.ok()) {  // a hint only: the experts that failed are read when first used
    std::fprintf(stderr,
                 "magnetar: warning: the census's warm start stopped at a read error (%s); experts are read "
                 "when first used\n",
                 io_error_.message().c_str());
    io_error_ = Status();
  }
  stats_.warm_experts = keys.size();
  stats_.warm_bytes = stats_.total().bytes_read - bytes_before;
  stats_.warm_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (LayerStats& s : stats_.layers) s = LayerStats{};  // warm-up reads are reported apart
  return Status();
}

void StreamedExperts::reset_stats() {
  for (LayerStats& s : stats_.layers) s = LayerStats{};
  stats_.evictions = 0;
}

void StreamedExperts::maybe_save_census() {
  if (options_.census_path.empty() || census_unwritable_) return;
  if (std::chrono::duration<double>(Clock::now() - census_saved_).count() < options_.census_save_seconds) return;
  if (Status s = save_census(/*wait=*/false); !s.ok()) std::fprintf(stderr, "magnetar: %s\n", s.message().c_str());
}

Status StreamedExperts::save_census(bool wait) {
  census_saved_ = Clock::now();
  if (options_.census_path.empty() || census_unwritable_) return Status();
  // A folder this process cannot write (a read-only mount of the models): said once, not every minute.
  const std::string dir = std::filesystem::path(options_.census_path).parent_path().string();
  if (::access(dir.empty() ? "." : dir.c_str(), W_OK) != 0) {
    census_unwritable_ = true;
    return Status::error(
        format("%s: cannot write the census there (%s): it is not saved in this run (--no-census "
               "turns it off)",
               dir.empty() ? "." : dir.c_str(), std::strerror(errno)));
  }
  // Merge with what is on disk now (another run may have saved since we loaded), under a lock that processes sharing
  // the model take too: each merge sees the one before it. The periodic save does not wait for it (it runs between
  // layers): when another process holds it (or is stopped holding it), the counts stay here for the next save.
  const int lock = ::open((options_.census_path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock >= 0) {
    int r;
    while ((r = ::flock(lock, wait ? LOCK_EX : LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      ::close(lock);
      return Status();
    }
  }
  Result<Census> disk = load_census(options_.census_path, identity_, layout_.n_layer(), layout_.n_expert());
  Census merged = disk.ok() ? std::move(disk).value() : census_delta_;
  if (disk.ok()) {
    for (size_t k = 0; k < merged.counts.size(); ++k) merged.counts[k] += census_delta_.counts[k];
  }
  const Status saved = save_census_file(merged);
  if (lock >= 0) ::close(lock);  // releases the lock
  MAGNETAR_RETURN_IF_ERROR(saved);
  std::fill(census_delta_.counts.begin(), census_delta_.counts.end(), 0);
  return Status();
}

Status StreamedExperts::save_census_file(const Census& census) {
  return experts::save_census(options_.census_path, identity_, census);
}

std::vector<uint8_t> StreamedExperts::cached() const {
  std::vector<uint8_t> out(where_.size(), 0);
  for (size_t k = 0; k < where_.size(); ++k) out[k] = where_[k] >= 0 && slots_[size_t(where_[k])].state == State::kReady;
  return out;
}

std::string StreamedExperts::describe() const {
  std::string s = reader_->name() + (direct_ ? ", O_DIRECT" : ", buffered (O_DIRECT refused)");
  s += format(", %zu slots of %.2f MiB (%.2f GiB, committed in %.1f s), policy %s, %s layout", slots_.size(),
              double(slab_bytes_) / double(1 << 20), double(pool_bytes_) / double(1ull << 30), pool_seconds_, policy_->name(),
              layout_.packed() ? "packed" : "standard");
  s += format(", reads merged across gaps up to %llu KiB", (unsigned long long)(gap_buffer_bytes_ >> 10));
  if (bandwidth_ > 0) {
    s += format(" (a request costs %.0f us at depth, reads run at %.0f MB/s)", request_seconds_ * 1e6, bandwidth_ / 1e6);
  }
  if (!options_.census_path.empty()) {
    s += format(", census: %llu experts warm (%.2f GiB in %.2f s)", (unsigned long long)stats_.warm_experts,
                double(stats_.warm_bytes) / double(1ull << 30), stats_.warm_seconds);
  }
  return s;
}

}  // namespace magnetar::experts
