#include "experts/layout.h"

#include <charconv>
#include <cstring>
#include <map>

#include "base/check.h"

namespace magnetar::experts {
namespace {

// Layer indices above this are refused before anything is sized by them (a hostile name such as
// blk.99999999999.ffn_gate_exps.weight must not allocate a table that large). The largest published MoE
// models have under 100 layers.
constexpr int64_t kMaxLayers = 1 << 16;
constexpr int64_t kMaxExperts = 1 << 20;  // same reasoning (published models have at most 384)

std::string shape_of(const std::array<int64_t, 3>& ne) {
  return format("[%lld, %lld, %lld]", (long long)ne[0], (long long)ne[1], (long long)ne[2]);
}

// Bytes of one [ne0, ne1] slab of a type, or an error naming `what`.
Result<uint64_t> slab_bytes(uint32_t type_id, int64_t ne0, int64_t ne1, const std::string& what) {
  std::string problem;
  const std::optional<uint64_t> n = gguf::tensor_nbytes(type_id, {ne0, ne1, 1, 1}, &problem);
  if (!n) return Status::error(what + ": " + problem);
  return *n;
}

// Reads an array-of-integers metadata value as int64 (nullopt when absent, not an array or any item does not
// fit).
std::optional<std::vector<int64_t>> int_array(const gguf::Value* v) {
  if (!v || v->type != gguf::ValueType::kArray) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const gguf::Value& item : v->array) {
    const std::optional<int64_t> x = item.as_int();
    if (!x) return std::nullopt;
    out.push_back(*x);
  }
  return out;
}

}  // namespace

// ---- Names -------------------------------------------------------------------------------------------------

std::string part_tensor_name(int64_t layer, Part p) {
  return format("blk.%lld.ffn_%s_exps.weight", (long long)layer, kPartNames[int(p)]);
}

std::string packed_tensor_name(int64_t layer) { return format("blk.%lld.ffn_exps_packed", (long long)layer); }

std::optional<PartName> parse_part_tensor_name(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix) || !name.ends_with("_exps.weight")) return std::nullopt;
  const char* begin = name.data() + kPrefix.size();
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), layer);
  if (ec != std::errc() || end == begin || layer < 0) return std::nullopt;
  // The round trip rejects spellings such as "blk.03." that llama.cpp would never look up.
  for (int p = 0; p < kParts; ++p) {
    if (part_tensor_name(layer, Part(p)) == name) return PartName{layer, Part(p)};
  }
  return std::nullopt;
}

// ---- Detection ---------------------------------------------------------------------------------------------

Result<ExpertLayout> ExpertLayout::from_model(const gguf::Model& model) {
  if (model.find(kKeyPackVersion)) return packed_layout(model);
  return standard_layout(model);
}

Status ExpertLayout::check_expert_count(const gguf::Model& model, const std::string& tensor) const {
  const std::string key = model.architecture() + ".expert_count";
  const gguf::Value* v = model.find(key);
  if (!v || n_expert_ == 0) return Status();
  const std::optional<uint64_t> n = v->as_uint();
  if (!n || *n != uint64_t(n_expert_)) {
    return Status::error(format("%s: metadata '%s' is %s, but tensor '%s' holds %lld experts",
                                model.shards()[0]->path().c_str(), key.c_str(), v->to_string().c_str(), tensor.c_str(),
                                (long long)n_expert_));
  }
  return Status();
}

// ---- Standard layout: three stacked tensors per MoE layer ---------------------------------------------------

Result<ExpertLayout> ExpertLayout::standard_layout(const gguf::Model& model) {
  const std::string& file = model.shards()[0]->path();
  std::map<int64_t, std::array<const gguf::TensorInfo*, kParts>> found;
  for (const gguf::TensorInfo& t : model.tensors()) {
    if (t.name == kTableTensor || t.name.ends_with(".ffn_exps_packed")) {
      return Status::error(format("%s: tensor '%s': a packed-layout tensor, but metadata '%s' is missing",
                                  model.shards()[t.shard]->path().c_str(), t.name.c_str(), kKeyPackVersion));
    }
    const std::optional<PartName> pn = parse_part_tensor_name(t.name);
    if (!pn) continue;
    if (pn->layer >= kMaxLayers) {
      return Status::error(format("%s: tensor '%s': layer index %lld out of range (max %lld)",
                                  model.shards()[t.shard]->path().c_str(), t.name.c_str(), (long long)pn->layer,
                                  (long long)kMaxLayers - 1));
    }
    found[pn->layer][size_t(pn->part)] = &t;
  }

  ExpertLayout out;
  std::string first_name;
  for (const auto& [layer, tensors] : found) {
    for (int p = 0; p < kParts; ++p) {
      if (tensors[size_t(p)]) continue;
      const gguf::TensorInfo* present = tensors[0] ? tensors[0] : tensors[1] ? tensors[1] : tensors[2];
      return Status::error(format("%s: tensor '%s': missing (layer %lld has '%s')", file.c_str(),
                                  part_tensor_name(layer, Part(p)).c_str(), (long long)layer, present->name.c_str()));
    }
    if (out.layers_.size() <= size_t(layer)) out.layers_.resize(size_t(layer) + 1);
    Layer& entry = out.layers_[size_t(layer)];
    entry.present = true;
    for (int p = 0; p < kParts; ++p) {
      const gguf::TensorInfo& t = *tensors[size_t(p)];
      const std::string& path = model.shards()[t.shard]->path();
      if (t.n_dims != 3 || t.ne[0] < 1 || t.ne[1] < 1 || t.ne[2] < 1 || t.ne[2] > kMaxExperts) {
        return Status::error(format("%s: tensor '%s': shape %s is not [n_in, n_out, n_expert]", path.c_str(),
                                    t.name.c_str(), t.shape_string().c_str()));
      }
      if (out.n_expert_ == 0) {
        out.n_expert_ = t.ne[2];
        first_name = t.name;
      } else if (t.ne[2] != out.n_expert_) {
        return Status::error(format("%s: tensor '%s': %lld experts, but '%s' has %lld", path.c_str(), t.name.c_str(),
                                    (long long)t.ne[2], first_name.c_str(), (long long)out.n_expert_));
      }
      PartDesc& d = entry.parts[size_t(p)];
      d.name = t.name;
      d.type = quant::Type(t.type_id);
      d.ne = {t.ne[0], t.ne[1], t.ne[2]};
      MAGNETAR_ASSIGN_OR_RETURN(d.bytes_per_expert,
                                slab_bytes(t.type_id, t.ne[0], t.ne[1], path + ": tensor '" + t.name + "'"));
      const uint64_t start = model.shards()[t.shard]->header().data_offset + t.offset;
      if (d.bytes_per_expert * uint64_t(t.ne[2]) != t.nbytes || start > model.shards()[t.shard]->size() ||
          t.nbytes > model.shards()[t.shard]->size() - start) {
        return Status::error(format("%s: tensor '%s': data [%llu, +%llu) outside the file (%llu bytes)", path.c_str(),
                                    t.name.c_str(), (unsigned long long)start, (unsigned long long)t.nbytes,
                                    (unsigned long long)model.shards()[t.shard]->size()));
      }
    }
    entry.extents.resize(size_t(out.n_expert_));
    for (int64_t e = 0; e < out.n_expert_; ++e) {
      for (int p = 0; p < kParts; ++p) {
        const gguf::TensorInfo& t = *tensors[size_t(p)];
        const uint64_t bpe = entry.parts[size_t(p)].bytes_per_expert;
        entry.extents[size_t(e)][size_t(p)] = {
            .shard = t.shard,
            .offset = model.shards()[t.shard]->header().data_offset + t.offset + uint64_t(e) * bpe,
            .bytes = bpe};
      }
    }
  }
  MAGNETAR_RETURN_IF_ERROR(out.check_expert_count(model, first_name));
  return out;
}

// ---- Packed layout: metadata keys, one record tensor per layer, the extent table ----------------------------

Result<ExpertLayout> ExpertLayout::packed_layout(const gguf::Model& model) {
  const std::string& file = model.shards()[0]->path();
  auto key_error = [&](const char* key, const std::string& problem) {
    return Status::error(format("%s: metadata '%s': %s", file.c_str(), key, problem.c_str()));
  };
  const gguf::Value* version = model.find(kKeyPackVersion);
  if (version->type != gguf::ValueType::kUint32 || version->u != kPackVersion) {
    return key_error(kKeyPackVersion, format("unknown pack version %s (this build reads %u)",
                                             version->to_string().c_str(), kPackVersion));
  }
  const gguf::Value* alignment = model.find(kKeyPackAlignment);
  if (!alignment || alignment->as_uint() != std::optional<uint64_t>(kPackAlignment)) {
    return key_error(kKeyPackAlignment, format("must be %llu, got %s", (unsigned long long)kPackAlignment,
                                               alignment ? alignment->to_string().c_str() : "nothing"));
  }
  for (const auto& shard : model.shards()) {
    if (shard->header().alignment != kPackAlignment) {
      return Status::error(format("%s: metadata 'general.alignment': a packed file needs %llu, got %u",
                                  shard->path().c_str(), (unsigned long long)kPackAlignment,
                                  shard->header().alignment));
    }
  }
  const gguf::Value* parts = model.find(kKeyPackParts);
  if (!parts || parts->type != gguf::ValueType::kArray || parts->array_type != gguf::ValueType::kString ||
      parts->array.empty() || parts->array.size() % kParts != 0) {
    return key_error(kKeyPackParts, "must be a non-empty array of strings, three per packed layer");
  }
  const size_t n_packed = parts->array.size() / kParts;
  const std::optional<std::vector<int64_t>> types = int_array(model.find(kKeyPackPartTypes));
  if (!types || types->size() != parts->array.size()) {
    return key_error(kKeyPackPartTypes, format("must be an array of %zu integers", parts->array.size()));
  }
  const std::optional<std::vector<int64_t>> shapes = int_array(model.find(kKeyPackPartShapes));
  if (!shapes || shapes->size() != 3 * parts->array.size()) {
    return key_error(kKeyPackPartShapes, format("must be an array of %zu integers", 3 * parts->array.size()));
  }

  // Part descriptions, from the metadata.
  ExpertLayout out;
  out.packed_ = true;
  std::vector<int64_t> layer_of(n_packed);
  for (size_t k = 0; k < n_packed; ++k) {
    std::array<PartDesc, kParts> descs;
    for (int p = 0; p < kParts; ++p) {
      const size_t i = k * kParts + size_t(p);
      const std::string& name = parts->array[i].str;
      const std::optional<PartName> pn = parse_part_tensor_name(name);
      if (!pn || pn->part != Part(p) || pn->layer >= kMaxLayers || (p > 0 && pn->layer != layer_of[k]) ||
          (p == 0 && k > 0 && pn->layer <= layer_of[k - 1])) {
        return key_error(kKeyPackParts, format("item %zu '%s' is not the %s part of the next packed layer", i,
                                               name.c_str(), kPartNames[p]));
      }
      layer_of[k] = pn->layer;
      if (model.find_tensor(name)) {
        return Status::error(format("%s: tensor '%s': present, but metadata '%s' says it was packed", file.c_str(),
                                    name.c_str(), kKeyPackParts));
      }
      PartDesc& d = descs[size_t(p)];
      d.name = name;
      d.ne = {(*shapes)[3 * i], (*shapes)[3 * i + 1], (*shapes)[3 * i + 2]};
      const int64_t type_id = (*types)[i];
      if (type_id < 0 || type_id > int64_t(UINT32_MAX) || d.ne[0] < 1 || d.ne[1] < 1 || d.ne[2] < 1 ||
          d.ne[2] > kMaxExperts) {
        return key_error(kKeyPackPartShapes, format("part '%s': type %lld, shape %s is not valid", name.c_str(),
                                                    (long long)type_id, shape_of(d.ne).c_str()));
      }
      d.type = quant::Type(uint32_t(type_id));
      MAGNETAR_ASSIGN_OR_RETURN(d.bytes_per_expert,
                                slab_bytes(uint32_t(type_id), d.ne[0], d.ne[1],
                                           file + ": metadata '" + kKeyPackPartTypes + "': part '" + name + "'"));
      if (out.n_expert_ == 0) out.n_expert_ = d.ne[2];
      if (d.ne[2] != out.n_expert_) {
        return key_error(kKeyPackPartShapes,
                         format("part '%s' has %lld experts, '%s' has %lld", name.c_str(), (long long)d.ne[2],
                                parts->array[0].str.c_str(), (long long)out.n_expert_));
      }
    }
    out.layers_.resize(size_t(layer_of[k]) + 1);
    out.layers_[size_t(layer_of[k])].present = true;
    out.layers_[size_t(layer_of[k])].parts = std::move(descs);
  }
  for (const gguf::TensorInfo& t : model.tensors()) {
    if (parse_part_tensor_name(t.name)) {
      return Status::error(format("%s: tensor '%s': stacked experts in a packed file, not listed in '%s'",
                                  model.shards()[t.shard]->path().c_str(), t.name.c_str(), kKeyPackParts));
    }
  }

  // The record tensors: [record_stride, n_expert] of I8 per packed layer.
  for (size_t k = 0; k < n_packed; ++k) {
    Layer& entry = out.layers_[size_t(layer_of[k])];
    const std::string name = packed_tensor_name(layer_of[k]);
    const gguf::TensorInfo* t = model.find_tensor(name);
    const uint64_t expert_bytes =
        entry.parts[0].bytes_per_expert + entry.parts[1].bytes_per_expert + entry.parts[2].bytes_per_expert;
    if (!t) return Status::error(format("%s: tensor '%s': missing", file.c_str(), name.c_str()));
    if (t->type_id != quant::kTypeIdI8 || t->n_dims != 2 || t->ne[1] != out.n_expert_ ||
        uint64_t(t->ne[0]) % kPackAlignment != 0 || uint64_t(t->ne[0]) < expert_bytes) {
      return Status::error(format("%s: tensor '%s': type %u shape %s, expected I8 [k * %llu >= %llu, %lld]",
                                  model.shards()[t->shard]->path().c_str(), name.c_str(), t->type_id,
                                  t->shape_string().c_str(), (unsigned long long)kPackAlignment,
                                  (unsigned long long)expert_bytes, (long long)out.n_expert_));
    }
    entry.record_stride = uint64_t(t->ne[0]);
  }

  // The extent table: [4, 3 * n_expert * n_packed] of I64.
  const gguf::TensorInfo* table = model.find_tensor(kTableTensor);
  const int64_t n_rows = int64_t(kParts) * out.n_expert_ * int64_t(n_packed);
  if (!table) return Status::error(format("%s: tensor '%s': missing", file.c_str(), kTableTensor));
  const std::string& table_path = model.shards()[table->shard]->path();
  if (table->type_id != quant::kTypeIdI64 || table->n_dims != 2 || table->ne[0] != kTableColumns ||
      table->ne[1] != n_rows) {
    return Status::error(format("%s: tensor '%s': type %u shape %s, expected I64 [%d, %lld]", table_path.c_str(),
                                kTableTensor, table->type_id, table->shape_string().c_str(), kTableColumns,
                                (long long)n_rows));
  }
  for (size_t k = 0; k < n_packed; ++k) {
    Layer& entry = out.layers_[size_t(layer_of[k])];
    entry.extents.resize(size_t(out.n_expert_));
    entry.records.resize(size_t(out.n_expert_));
    for (int64_t e = 0; e < out.n_expert_; ++e) {
      for (int p = 0; p < kParts; ++p) {
        const int64_t row = (int64_t(k) * out.n_expert_ + e) * kParts + p;
        int64_t v[kTableColumns];
        std::memcpy(v, table->data + row * kTableColumns * 8, sizeof(v));
        auto row_error = [&](const std::string& problem) {
          return Status::error(format("%s: tensor '%s' row %lld (layer %lld expert %lld part %s): %s",
                                      table_path.c_str(), kTableTensor, (long long)row, (long long)layer_of[k],
                                      (long long)e, kPartNames[p], problem.c_str()));
        };
        const uint64_t bpe = entry.parts[size_t(p)].bytes_per_expert;
        if (v[3] != layer_of[k]) return row_error(format("says layer %lld", (long long)v[3]));
        if (v[2] < 0 || v[2] >= int64_t(model.shards().size())) {
          return row_error(format("shard %lld of %zu", (long long)v[2], model.shards().size()));
        }
        if (v[1] < 0 || uint64_t(v[1]) != bpe) {
          return row_error(format("%lld bytes, the part has %llu", (long long)v[1], (unsigned long long)bpe));
        }
        const gguf::GgufFile& shard = *model.shards()[size_t(v[2])];
        const uint64_t size = shard.size();
        const uint64_t start = shard.header().data_offset + uint64_t(v[0]);
        if (v[0] < 0 || uint64_t(v[0]) > size || start > size || bpe > size - start) {
          return row_error(format("[%lld, +%llu) of the data section is outside %s (%llu bytes)", (long long)v[0],
                                  (unsigned long long)bpe, shard.path().c_str(), (unsigned long long)size));
        }
        entry.extents[size_t(e)][size_t(p)] = {.shard = uint32_t(v[2]), .offset = start, .bytes = bpe};
      }
      // The record: gate | up | down back to back from an aligned offset, inside the file.
      const auto& x = entry.extents[size_t(e)];
      const Extent record{.shard = x[0].shard, .offset = x[0].offset, .bytes = entry.record_stride};
      const uint64_t size = model.shards()[record.shard]->size();
      if (record.offset % kPackAlignment != 0 || x[1].shard != record.shard || x[2].shard != record.shard ||
          x[1].offset != x[0].offset + x[0].bytes || x[2].offset != x[1].offset + x[1].bytes ||
          record.bytes > size - record.offset) {
        return Status::error(
            format("%s: tensor '%s' (layer %lld expert %lld): the parts do not form one record of "
                   "%llu bytes at a %llu-byte aligned offset inside the file",
                   table_path.c_str(), kTableTensor, (long long)layer_of[k], (long long)e,
                   (unsigned long long)entry.record_stride, (unsigned long long)kPackAlignment));
      }
      entry.records[size_t(e)] = record;
    }
  }
  MAGNETAR_RETURN_IF_ERROR(out.check_expert_count(model, out.layers_[size_t(layer_of[0])].parts[0].name));
  return out;
}

// ---- Accessors ---------------------------------------------------------------------------------------------

bool ExpertLayout::has_experts(int64_t layer) const {
  return layer >= 0 && layer < n_layer() && layers_[size_t(layer)].present;
}

const PartDesc& ExpertLayout::part(int64_t layer, Part p) const {
  MAGNETAR_CHECK(has_experts(layer));
  return layers_[size_t(layer)].parts[size_t(p)];
}

Extent ExpertLayout::extent(int64_t layer, int64_t expert, Part p) const {
  MAGNETAR_CHECK(has_experts(layer) && expert >= 0 && expert < n_expert_);
  return layers_[size_t(layer)].extents[size_t(expert)][size_t(p)];
}

std::optional<Extent> ExpertLayout::record(int64_t layer, int64_t expert) const {
  MAGNETAR_CHECK(has_experts(layer) && expert >= 0 && expert < n_expert_);
  if (!packed_) return std::nullopt;
  return layers_[size_t(layer)].records[size_t(expert)];
}

uint64_t ExpertLayout::record_stride(int64_t layer) const {
  MAGNETAR_CHECK(has_experts(layer));
  return layers_[size_t(layer)].record_stride;
}

uint64_t ExpertLayout::expert_bytes(int64_t layer) const {
  MAGNETAR_CHECK(has_experts(layer));
  const Layer& entry = layers_[size_t(layer)];
  return entry.parts[0].bytes_per_expert + entry.parts[1].bytes_per_expert + entry.parts[2].bytes_per_expert;
}

int64_t ExpertLayout::n_moe_layers() const {
  int64_t n = 0;
  for (const Layer& entry : layers_) n += entry.present ? 1 : 0;
  return n;
}

uint64_t ExpertLayout::total_expert_bytes() const {
  uint64_t n = 0;
  for (int64_t l = 0; l < n_layer(); ++l) {
    if (has_experts(l)) n += expert_bytes(l) * uint64_t(n_expert_);
  }
  return n;
}

}  // namespace magnetar::experts
