// The seam between a model's MoE block and wherever its routed experts live (ARCHITECTURE.md, one decode
// step, steps 2-5). The model asks for the distinct experts one layer's tokens chose and gets plain pointers
// to each expert's gate / up / down matrices; it never learns whether they came from the mapping, the RAM
// cache or the disk, and the source never learns the math.
//
// Protocol, per MoE layer of one forward call (one thread calls everything, in this order):
//   acquire(layer, ids, ptrs, ready)   pins the experts; ready[i] = 1 and ptrs[i] set for usable ones, the
//                                      reads of the others are in flight when it returns
//   prefetch(layer + 1, guess)         optional hint; never evicts pinned entries
//   wait(ptrs)                         blocks until all are usable, fills the remaining ptrs
//   release()                          unpins (Pinned below does it on scope exit)
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "experts/layout.h"

namespace magnetar::experts {

struct ExpertPtrs {
  const uint8_t* part[kParts] = {nullptr, nullptr, nullptr};  // gate, up, down: [n_out rows of n_in]
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // `experts`: distinct expert ids of `layer`; ptrs and ready have the same length.
  virtual void acquire(int64_t layer, std::span<const int32_t> experts, std::span<ExpertPtrs> ptrs,
                       std::span<uint8_t> ready) = 0;
  // Fills ptrs for every expert of the acquired layer; an I/O failure is an error naming the file.
  virtual Status wait(std::span<ExpertPtrs> ptrs) = 0;
  virtual void release() = 0;
  // A hint: `experts` of `layer` will probably be acquired soon. Ids out of range and layers without experts are
  // ignored.
  virtual void prefetch(int64_t /*layer*/, std::span<const int32_t> /*experts*/) {}
  // Counts a use of these experts of `layer` that the caller served without acquiring them (a GPU tier's pool hits
  // during a prefill sweep) in their popularity (eviction score, census), as an acquire would; no pins, no reads.
  virtual void touch(int64_t /*layer*/, std::span<const int32_t> /*experts*/) {}
  // The one host range every pointer from this source lies in, when the source owns it (the RAM store's slot
  // arena); empty when the pointers point into mapped files. A GPU tier page-locks it for fast copies.
  virtual std::span<uint8_t> host_memory() { return {}; }
};

// Releases the acquired layer on scope exit (early returns included).
class Pinned {
 public:
  explicit Pinned(ExpertSource& source) : source_(source) {}
  ~Pinned() { source_.release(); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;

 private:
  ExpertSource& source_;
};

// Every expert usable in place from the read-only mapping of the model's files (resident mode: the page
// cache holds the weights). Works for both layouts.
class MappedExperts final : public ExpertSource {
 public:
  MappedExperts(const gguf::Model& model, const ExpertLayout& layout) : model_(model), layout_(layout) {}
  void acquire(int64_t layer, std::span<const int32_t> experts, std::span<ExpertPtrs> ptrs,
               std::span<uint8_t> ready) override {
    for (size_t i = 0; i < experts.size(); ++i) {
      for (int p = 0; p < kParts; ++p) {
        const Extent x = layout_.extent(layer, experts[i], Part(p));
        ptrs[i].part[p] = model_.shards()[x.shard]->bytes() + x.offset;
      }
      ready[i] = 1;
    }
  }
  Status wait(std::span<ExpertPtrs>) override { return Status(); }
  void release() override {}

 private:
  const gguf::Model& model_;
  const ExpertLayout& layout_;
};

}  // namespace magnetar::experts
