#include "experts/pack.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "base/check.h"
#include "gguf/writer.h"

namespace magnetar::experts {
namespace {

// Bytes handed to the writer (and between progress reports) at a time: large enough that the calls cost
// nothing next to the copy, small enough for a smooth progress bar.
constexpr uint64_t kChunkBytes = 8ull << 20;

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

bool is_split_key(const std::string& key) { return key.starts_with("split."); }
bool is_pack_key(const std::string& key) { return key.starts_with("magnetar.pack."); }

// ---- Page cache hygiene ------------------------------------------------------------------------------------
// Reading a 30+ GiB model once through its mapping would fill the page cache with pages that are never read
// again and evict everything else. So each range read is bracketed: begin() notes which of its pages were
// cached already (mincore), end() unmaps the range from this process (madvise) and drops from the cache only
// the pages that were not (posix_fadvise): the cache is left as it was found, and a model that was hot (just
// written, or in use) stays hot. All of it is advice; failures are ignored.
class PageCacheGuard {
 public:
  struct Range {
    uint32_t shard = 0;
    uint64_t begin = 0, end = 0;          // whole pages inside the range, file offsets
    std::vector<unsigned char> resident;  // one per page of [begin, end), before reading
  };

  explicit PageCacheGuard(const gguf::Model& model) : model_(model), page_(uint64_t(sysconf(_SC_PAGESIZE))) {
    for (const auto& shard : model.shards()) {
      fds_.push_back(::open(shard->path().c_str(), O_RDONLY | O_CLOEXEC));
      madvise(const_cast<uint8_t*>(shard->bytes()), shard->size(), MADV_SEQUENTIAL);
    }
  }
  ~PageCacheGuard() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  PageCacheGuard(const PageCacheGuard&) = delete;
  PageCacheGuard& operator=(const PageCacheGuard&) = delete;

  Range begin(uint32_t shard, uint64_t offset, uint64_t bytes) const {
    Range r{.shard = shard, .begin = round_up(offset, page_), .end = (offset + bytes) / page_ * page_, .resident = {}};
    if (r.end <= r.begin) return Range{};
    r.resident.resize((r.end - r.begin) / page_);
    // On failure (or a kernel that hides residency from non-owners) every page counts as not cached.
    if (mincore(addr(r.shard, r.begin), r.end - r.begin, r.resident.data()) != 0)
      r.resident.assign(r.resident.size(), 0);
    return r;
  }
  Range begin(const gguf::TensorInfo& t) const {
    return begin(t.shard, model_.shards()[t.shard]->header().data_offset + t.offset, t.nbytes);
  }

  void end(const Range& r) const {
    if (r.end <= r.begin) return;
    madvise(addr(r.shard, r.begin), r.end - r.begin, MADV_DONTNEED);
    if (fds_[r.shard] < 0) return;
    for (size_t i = 0; i < r.resident.size();) {
      if (r.resident[i] & 1) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < r.resident.size() && !(r.resident[j] & 1)) ++j;
      posix_fadvise(fds_[r.shard], off_t(r.begin + i * page_), off_t((j - i) * page_), POSIX_FADV_DONTNEED);
      i = j;
    }
  }

 private:
  void* addr(uint32_t shard, uint64_t offset) const {
    return const_cast<uint8_t*>(model_.shards()[shard]->bytes()) + offset;
  }
  const gguf::Model& model_;
  uint64_t page_;
  std::vector<int> fds_;
};

const uint8_t* data_at(const gguf::Model& model, const Extent& x) {
  return model.shards()[x.shard]->bytes() + x.offset;
}

// ---- Writing -----------------------------------------------------------------------------------------------

// Streams bytes into the writer in chunks, reporting progress (the writer releases written pages as it goes).
class Copier {
 public:
  Copier(gguf::Writer& w, const PackOptions& options, uint64_t total) : w_(w), options_(options), total_(total) {}

  Status copy(const uint8_t* data, uint64_t n, bool counts = true) {
    while (n > 0) {
      const uint64_t take = std::min(n, kChunkBytes);
      MAGNETAR_RETURN_IF_ERROR(w_.write({data, size_t(take)}));
      data += take;
      n -= take;
      if (counts) done_ += take;
      if (options_.progress) options_.progress(done_, total_);
    }
    return Status();
  }

 private:
  gguf::Writer& w_;
  const PackOptions& options_;
  uint64_t total_;
  uint64_t done_ = 0;
};

// ---- Verification helpers ----------------------------------------------------------------------------------

// Index of the first differing byte of two equal-length ranges, or nullopt when equal; compares in chunks
// and reports progress.
std::optional<uint64_t> first_difference(const uint8_t* a, const uint8_t* b, uint64_t n, uint64_t& done, uint64_t total,
                                         const VerifyOptions& options) {
  for (uint64_t at = 0; at < n; at += kChunkBytes) {
    const uint64_t take = std::min(n - at, kChunkBytes);
    if (std::memcmp(a + at, b + at, size_t(take)) != 0) {
      for (uint64_t k = at;; ++k) {
        if (a[k] != b[k]) return k;
      }
    }
    done += take;
    if (options.progress) options.progress(done, total);
  }
  return std::nullopt;
}

std::string tensor_signature(const gguf::TensorInfo& t) {
  const quant::TypeSizeInfo* type = quant::find_type_size(t.type_id);
  return format("%s %s", type ? std::string(type->name).c_str() : format("type%u", t.type_id).c_str(),
                t.shape_string().c_str());
}

}  // namespace

// ---- Planning ----------------------------------------------------------------------------------------------

Result<PackPlan> plan_pack(const gguf::Model& src) {
  const std::string& file = src.shards()[0]->path();
  MAGNETAR_ASSIGN_OR_RETURN(ExpertLayout layout, ExpertLayout::from_model(src));
  if (layout.packed()) {
    return Status::error(
        format("%s: already packed (metadata '%s' is present): nothing to do", file.c_str(), kKeyPackVersion));
  }
  if (layout.n_moe_layers() == 0) {
    return Status::error(
        format("%s: no routed experts (no blk.N.ffn_{gate,up,down}_exps.weight tensors): "
               "nothing to pack",
               file.c_str()));
  }
  for (int64_t l = 0; l < layout.n_layer(); ++l) {
    for (int p = 0; layout.has_experts(l) && p < kParts; ++p) {
      const PartDesc& d = layout.part(l, Part(p));
      if (!quant::computable(uint32_t(d.type))) {
        return Status::error(
            format("%s: tensor '%s' has type %s, which Magnetar cannot compute with: a packed copy "
                   "could not be run either",
                   file.c_str(), d.name.c_str(), quant::type_label(uint32_t(d.type)).c_str()));
      }
    }
  }
  PackPlan plan;
  for (const gguf::TensorInfo& t : src.tensors()) plan.tensor_bytes_in += t.nbytes;
  for (int64_t l = 0; l < layout.n_layer(); ++l) {
    if (!layout.has_experts(l)) continue;
    const PackedLayer p{.layer = l,
                        .expert_bytes = layout.expert_bytes(l),
                        .record_stride = round_up(layout.expert_bytes(l), kPackAlignment)};
    plan.layers.push_back(p);
    plan.expert_bytes += p.expert_bytes * uint64_t(layout.n_expert());
    plan.padding_bytes += (p.record_stride - p.expert_bytes) * uint64_t(layout.n_expert());
  }
  plan.table_bytes =
      uint64_t(kTableColumns) * sizeof(int64_t) * kParts * uint64_t(layout.n_expert()) * plan.layers.size();
  plan.layout = std::move(layout);
  return plan;
}

// ---- Packing -----------------------------------------------------------------------------------------------

Status pack(const gguf::Model& src, const std::string& out_path, const PackOptions& options) {
  MAGNETAR_ASSIGN_OR_RETURN(const PackPlan plan, plan_pack(src));
  const ExpertLayout& layout = plan.layout;
  const int64_t n_expert = layout.n_expert();
  if (src.has_file(out_path)) {
    return Status::error(format("%s: is the input: packing writes a new file (-o)", out_path.c_str()));
  }

  // Header: metadata, then tensor infos in source order with each MoE layer's gate tensor replaced by its
  // record tensor (and its up/down tensors dropped), then the table.
  gguf::Writer w(out_path);
  w.release_every(gguf::Writer::kReleaseBytes);
  for (const gguf::KeyValue& kv : src.metadata()) {
    if (!is_split_key(kv.key)) w.set(kv.key, kv.value);
  }
  w.set_alignment(uint32_t(kPackAlignment));
  std::vector<gguf::Value> part_names, part_types, part_shapes;
  for (const PackedLayer& pl : plan.layers) {
    for (int p = 0; p < kParts; ++p) {
      const PartDesc& d = layout.part(pl.layer, Part(p));
      part_names.push_back(gguf::Value::of_string(d.name));
      part_types.push_back(gguf::Value::of_uint(gguf::ValueType::kUint32, uint32_t(d.type)));
      for (int64_t n : d.ne) part_shapes.push_back(gguf::Value::of_int(gguf::ValueType::kInt64, n));
    }
  }
  using gguf::ValueType;
  w.set(kKeyPackVersion, gguf::Value::of_uint(ValueType::kUint32, kPackVersion));
  w.set(kKeyPackAlignment, gguf::Value::of_uint(ValueType::kUint32, kPackAlignment));
  w.set(kKeyPackParts, gguf::Value::of_array(ValueType::kString, std::move(part_names)));
  w.set(kKeyPackPartTypes, gguf::Value::of_array(ValueType::kUint32, std::move(part_types)));
  w.set(kKeyPackPartShapes, gguf::Value::of_array(ValueType::kInt64, std::move(part_shapes)));

  std::map<int64_t, uint64_t> stride_of;
  for (const PackedLayer& pl : plan.layers) stride_of[pl.layer] = pl.record_stride;
  std::map<int64_t, size_t> record_tensor;  // layer -> index in w.tensors()
  for (const gguf::TensorInfo& t : src.tensors()) {
    const std::optional<PartName> pn = parse_part_tensor_name(t.name);
    if (pn) {
      if (pn->part != Part::kGate) continue;
      record_tensor[pn->layer] = w.tensors().size();
      const int64_t dims[] = {int64_t(stride_of.at(pn->layer)), n_expert};
      MAGNETAR_RETURN_IF_ERROR(w.add_tensor(packed_tensor_name(pn->layer), quant::kTypeIdI8, dims));
      continue;
    }
    MAGNETAR_RETURN_IF_ERROR(w.add_tensor(t.name, t.type_id, std::span<const int64_t>(t.ne.data(), size_t(t.n_dims))));
  }
  const int64_t n_rows = int64_t(kParts) * n_expert * int64_t(plan.layers.size());
  const int64_t table_dims[] = {kTableColumns, n_rows};
  MAGNETAR_RETURN_IF_ERROR(w.add_tensor(kTableTensor, quant::kTypeIdI64, table_dims));

  // The table, from the offsets the writer assigned: [n_rows][offset, bytes, shard, layer].
  std::vector<int64_t> table;
  table.reserve(size_t(n_rows) * kTableColumns);
  for (const PackedLayer& pl : plan.layers) {
    const uint64_t base = w.tensors()[record_tensor.at(pl.layer)].offset;
    for (int64_t e = 0; e < n_expert; ++e) {
      uint64_t offset = base + uint64_t(e) * pl.record_stride;
      for (int p = 0; p < kParts; ++p) {
        const uint64_t bytes = layout.part(pl.layer, Part(p)).bytes_per_expert;
        table.insert(table.end(), {int64_t(offset), int64_t(bytes), 0, pl.layer});
        offset += bytes;
      }
    }
  }

  // Data, in the same order.
  MAGNETAR_RETURN_IF_ERROR(w.begin());
  const PageCacheGuard cache(src);
  Copier copier(w, options, plan.tensor_bytes_in);
  static const uint8_t kZeros[kPackAlignment] = {};
  for (const gguf::TensorInfo& t : src.tensors()) {
    const std::optional<PartName> pn = parse_part_tensor_name(t.name);
    if (!pn) {
      const PageCacheGuard::Range r = cache.begin(t);
      MAGNETAR_RETURN_IF_ERROR(copier.copy(t.data, t.nbytes));
      cache.end(r);
      continue;
    }
    if (pn->part != Part::kGate) continue;
    // One layer: the three stacked tensors are read in step, expert by expert.
    const int64_t l = pn->layer;
    const uint64_t padding = stride_of.at(l) - layout.expert_bytes(l);
    std::vector<PageCacheGuard::Range> ranges;
    for (int p = 0; p < kParts; ++p) ranges.push_back(cache.begin(*src.find_tensor(layout.part(l, Part(p)).name)));
    for (int64_t e = 0; e < n_expert; ++e) {
      for (int p = 0; p < kParts; ++p) {
        const Extent x = layout.extent(l, e, Part(p));
        MAGNETAR_RETURN_IF_ERROR(copier.copy(data_at(src, x), x.bytes));
      }
      MAGNETAR_RETURN_IF_ERROR(copier.copy(kZeros, padding, /*counts=*/false));
    }
    for (const PageCacheGuard::Range& r : ranges) cache.end(r);
  }
  MAGNETAR_RETURN_IF_ERROR(
      copier.copy(reinterpret_cast<const uint8_t*>(table.data()), table.size() * sizeof(int64_t), false));
  return w.finish();
}

// ---- Verification ------------------------------------------------------------------------------------------

Status verify(const gguf::Model& packed, const gguf::Model& source, const VerifyOptions& options) {
  const std::string& pfile = packed.shards()[0]->path();
  const std::string& sfile = source.shards()[0]->path();
  MAGNETAR_ASSIGN_OR_RETURN(const ExpertLayout lp, ExpertLayout::from_model(packed));
  MAGNETAR_ASSIGN_OR_RETURN(const ExpertLayout ls, ExpertLayout::from_model(source));
  if (!lp.packed())
    return Status::error(format("%s: not a packed file (no metadata '%s')", pfile.c_str(), kKeyPackVersion));
  if (ls.packed()) {
    return Status::error(
        format("%s: is packed too: verify against the standard file it was packed from", sfile.c_str()));
  }

  // Experts: the same layers, part names, types and shapes.
  if (lp.n_expert() != ls.n_expert() || lp.n_layer() != ls.n_layer()) {
    return Status::error(format("%s: %lld experts in %lld layers, the source has %lld in %lld", pfile.c_str(),
                                (long long)lp.n_expert(), (long long)lp.n_layer(), (long long)ls.n_expert(),
                                (long long)ls.n_layer()));
  }
  for (int64_t l = 0; l < lp.n_layer(); ++l) {
    if (lp.has_experts(l) != ls.has_experts(l)) {
      return Status::error(format("%s: layer %lld: %s experts, the source %s", pfile.c_str(), (long long)l,
                                  lp.has_experts(l) ? "has" : "has no", ls.has_experts(l) ? "has" : "has none"));
    }
    if (!lp.has_experts(l)) continue;
    for (int p = 0; p < kParts; ++p) {
      const PartDesc &a = lp.part(l, Part(p)), &b = ls.part(l, Part(p));
      if (a.name != b.name || a.type != b.type || a.ne != b.ne) {
        return Status::error(
            format("%s: layer %lld part %s: '%s' type %u differs from the source's '%s' type %u "
                   "(or its shape does)",
                   pfile.c_str(), (long long)l, kPartNames[p], a.name.c_str(), uint32_t(a.type), b.name.c_str(),
                   uint32_t(b.type)));
      }
    }
  }

  // Metadata: the same keys in the same order with equal values, apart from what packing sets.
  auto kept = [](const std::vector<gguf::KeyValue>& kvs) {
    std::vector<const gguf::KeyValue*> out;
    for (const gguf::KeyValue& kv : kvs) {
      if (!is_pack_key(kv.key) && !is_split_key(kv.key) && kv.key != "general.alignment") out.push_back(&kv);
    }
    return out;
  };
  const std::vector<const gguf::KeyValue*> mp = kept(packed.metadata()), ms = kept(source.metadata());
  for (size_t k = 0; k < std::max(mp.size(), ms.size()); ++k) {
    if (k >= mp.size()) return Status::error(format("%s: metadata '%s': missing", pfile.c_str(), ms[k]->key.c_str()));
    if (k >= ms.size()) {
      return Status::error(format("%s: metadata '%s': not in the source", pfile.c_str(), mp[k]->key.c_str()));
    }
    if (mp[k]->key != ms[k]->key) {
      return Status::error(format("%s: metadata key #%zu is '%s', the source's is '%s'", pfile.c_str(), k,
                                  mp[k]->key.c_str(), ms[k]->key.c_str()));
    }
    if (!(mp[k]->value == ms[k]->value)) {
      return Status::error(format("%s: metadata '%s': differs from the source", pfile.c_str(), mp[k]->key.c_str()));
    }
  }

  // Non-expert tensors: the same list in the same order.
  std::vector<const gguf::TensorInfo*> tp, ts;
  for (const gguf::TensorInfo& t : packed.tensors()) {
    if (t.name != kTableTensor && !t.name.ends_with(".ffn_exps_packed")) tp.push_back(&t);
  }
  for (const gguf::TensorInfo& t : source.tensors()) {
    if (!parse_part_tensor_name(t.name)) ts.push_back(&t);
  }
  uint64_t total = ls.total_expert_bytes();
  for (size_t k = 0; k < std::max(tp.size(), ts.size()); ++k) {
    if (k >= tp.size()) return Status::error(format("%s: tensor '%s': missing", pfile.c_str(), ts[k]->name.c_str()));
    if (k >= ts.size()) {
      return Status::error(format("%s: tensor '%s': not in the source", pfile.c_str(), tp[k]->name.c_str()));
    }
    if (tp[k]->name != ts[k]->name) {
      return Status::error(format("%s: tensor #%zu (not counting packed ones) is '%s', the source's is '%s'",
                                  pfile.c_str(), k, tp[k]->name.c_str(), ts[k]->name.c_str()));
    }
    if (tensor_signature(*tp[k]) != tensor_signature(*ts[k])) {
      return Status::error(format("%s: tensor '%s': %s, the source's is %s", pfile.c_str(), tp[k]->name.c_str(),
                                  tensor_signature(*tp[k]).c_str(), tensor_signature(*ts[k]).c_str()));
    }
    total += ts[k]->nbytes;
  }

  const PageCacheGuard packed_cache(packed), source_cache(source);
  uint64_t done = 0;
  for (size_t k = 0; k < tp.size(); ++k) {
    const PageCacheGuard::Range rp = packed_cache.begin(*tp[k]), rs = source_cache.begin(*ts[k]);
    if (std::optional<uint64_t> at = first_difference(tp[k]->data, ts[k]->data, ts[k]->nbytes, done, total, options)) {
      return Status::error(format("%s: tensor '%s': byte %llu differs from the source", pfile.c_str(),
                                  tp[k]->name.c_str(), (unsigned long long)*at));
    }
    packed_cache.end(rp);
    source_cache.end(rs);
  }

  // Experts, record by record in packed file order: the three parts, then the padding.
  for (int64_t l = 0; l < lp.n_layer(); ++l) {
    if (!lp.has_experts(l)) continue;
    // Cache residency is noted for whole tensors before any of their bytes are read: per record, readahead
    // from the previous one would already have brought in the next.
    std::vector<PageCacheGuard::Range> ranges;
    for (int p = 0; p < kParts; ++p) {
      const Extent first = ls.extent(l, 0, Part(p));
      ranges.push_back(source_cache.begin(first.shard, first.offset, first.bytes * uint64_t(ls.n_expert())));
    }
    const gguf::TensorInfo* records = packed.find_tensor(packed_tensor_name(l));
    const PageCacheGuard::Range packed_range = records ? packed_cache.begin(*records) : PageCacheGuard::Range{};
    for (int64_t e = 0; e < lp.n_expert(); ++e) {
      const Extent r = *lp.record(l, e);
      for (int p = 0; p < kParts; ++p) {
        const Extent a = lp.extent(l, e, Part(p)), b = ls.extent(l, e, Part(p));
        MAGNETAR_CHECK(a.bytes == b.bytes);  // equal part descriptions, checked above
        if (std::optional<uint64_t> at =
                first_difference(data_at(packed, a), data_at(source, b), a.bytes, done, total, options)) {
          return Status::error(
              format("%s: layer %lld expert %lld part %s: byte %llu differs from the source "
                     "(file byte %llu of %s)",
                     pfile.c_str(), (long long)l, (long long)e, kPartNames[p], (unsigned long long)*at,
                     (unsigned long long)(a.offset + *at), packed.shards()[a.shard]->path().c_str()));
        }
      }
      const uint8_t* rec = data_at(packed, r);
      for (uint64_t k = lp.expert_bytes(l); k < r.bytes; ++k) {
        if (rec[k] != 0) {
          return Status::error(format(
              "%s: layer %lld expert %lld: padding byte %llu of the record (file byte %llu) "
              "is not zero",
              pfile.c_str(), (long long)l, (long long)e, (unsigned long long)k, (unsigned long long)(r.offset + k)));
        }
      }
    }
    packed_cache.end(packed_range);
    for (const PageCacheGuard::Range& r : ranges) source_cache.end(r);
  }
  return Status();
}

}  // namespace magnetar::experts
