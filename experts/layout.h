// Where every routed expert of a model lives in its GGUF file(s): the only place that knows the two
// on-disk layouts the expert store reads.
//
// Standard (llama.cpp) layout: each MoE layer has three stacked tensors blk.L.ffn_{gate,up,down}_exps.weight
// of shape [n_in, n_out, n_expert] (ggml order); expert e's part is the e-th [n_in, n_out] slab of each, so
// one expert is three separate extents, not aligned to anything.
//
// Expert-major (packed) layout, written by `magnetar pack` (format version 1):
//   - a valid GGUF v3 with general.alignment = 4096 (so the data section and every tensor start on a 4 KiB
//     file offset); all metadata and all non-expert tensors of the source unchanged and in source order;
//   - each MoE layer's three *_exps tensors are replaced, at the position of the layer's gate tensor, by one
//     tensor  blk.L.ffn_exps_packed  of type I8 and shape [record_stride, n_expert]: expert e's record is
//     bytes [e * record_stride, (e+1) * record_stride) of it and holds gate | up | down back to back (each
//     part exactly the bytes of its slab in the source), zero-padded to record_stride, a multiple of 4096;
//   - metadata  magnetar.pack.version (u32 = 1), magnetar.pack.alignment (u32 = 4096),
//     magnetar.pack.parts (array of string: the replaced tensors' names, per packed layer gate, up, down),
//     magnetar.pack.part_types (array of u32: their ggml types), magnetar.pack.part_shapes (array of i64:
//     ne[0], ne[1], ne[2] of each, three per part);
//   - one table tensor  magnetar.expert_table  of type I64 and shape [4, 3 * n_expert * n_packed_layers]:
//     row ((k * n_expert) + e) * 3 + p, for the k-th packed layer (in layer order), expert e, part p, holds
//     {offset of the part relative to the data section of its shard, bytes, shard index, layer}.
//   The runtime reads one record (one O_DIRECT read) per expert; the table lets a later packer place
//   records anywhere (e.g. hot experts together) without a format change.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/reader.h"
#include "quant/quant.h"

namespace magnetar::experts {

enum class Part : int { kGate = 0, kUp = 1, kDown = 2 };
inline constexpr int kParts = 3;
inline constexpr uint64_t kPackAlignment = 4096;
inline constexpr uint32_t kPackVersion = 1;
inline constexpr const char* kPartNames[kParts] = {"gate", "up", "down"};

// Names of the packed format (see above).
inline constexpr const char* kKeyPackVersion = "magnetar.pack.version";
inline constexpr const char* kKeyPackAlignment = "magnetar.pack.alignment";
inline constexpr const char* kKeyPackParts = "magnetar.pack.parts";
inline constexpr const char* kKeyPackPartTypes = "magnetar.pack.part_types";
inline constexpr const char* kKeyPackPartShapes = "magnetar.pack.part_shapes";
inline constexpr const char* kTableTensor = "magnetar.expert_table";
inline constexpr int kTableColumns = 4;  // offset (relative to the shard's data section), bytes, shard, layer

std::string part_tensor_name(int64_t layer, Part p);  // "blk.3.ffn_gate_exps.weight"
std::string packed_tensor_name(int64_t layer);        // "blk.3.ffn_exps_packed"
// The (layer, part) of a standard stacked expert tensor name; nullopt for every other name.
struct PartName {
  int64_t layer;
  Part part;
};
std::optional<PartName> parse_part_tensor_name(std::string_view name);

// A byte range of one file of the model.
struct Extent {
  uint32_t shard = 0;   // index into gguf::Model::shards()
  uint64_t offset = 0;  // absolute byte offset in that file
  uint64_t bytes = 0;
};

// Type and shape of one part of a layer's experts, as the standard stacked tensor describes it.
struct PartDesc {
  std::string name;                   // "blk.3.ffn_gate_exps.weight" (also in packed files)
  quant::Type type = quant::Type::F32;
  std::array<int64_t, 3> ne{0, 0, 0}; // [n_in, n_out, n_expert]
  uint64_t bytes_per_expert = 0;      // row_size(type, ne[0]) * ne[1]
};

class ExpertLayout {
 public:
  // The layout of `model` (standard or packed, detected from magnetar.pack.version). Every layer that has
  // routed experts must have all three parts with n_expert experts; errors name the file and tensor/key.
  // Layers without experts (dense layers) are allowed and reported by has_experts().
  static Result<ExpertLayout> from_model(const gguf::Model& model);

  bool packed() const { return packed_; }
  int64_t n_layer() const { return int64_t(layers_.size()); }  // highest layer index with experts + 1
  int64_t n_expert() const { return n_expert_; }
  bool has_experts(int64_t layer) const;
  const PartDesc& part(int64_t layer, Part p) const;
  // Where expert `expert`'s part `p` of `layer` lives.
  Extent extent(int64_t layer, int64_t expert, Part p) const;
  // Packed layout: the expert's whole record (offset and bytes multiples of kPackAlignment, parts inside it
  // in order gate, up, down, starting at the record's offset). Standard layout: nullopt.
  std::optional<Extent> record(int64_t layer, int64_t expert) const;
  // Packed layout: bytes of one record (a multiple of kPackAlignment, >= expert_bytes); standard: 0.
  uint64_t record_stride(int64_t layer) const;
  uint64_t expert_bytes(int64_t layer) const;  // sum of the three parts (no padding)
  int64_t n_moe_layers() const;                // layers with experts
  uint64_t total_expert_bytes() const;         // every routed expert of every layer (no padding)

 private:
  struct Layer {
    bool present = false;
    std::array<PartDesc, kParts> parts;
    std::vector<std::array<Extent, kParts>> extents;  // [n_expert]
    std::vector<Extent> records;                      // [n_expert], packed only
    uint64_t record_stride = 0;                       // packed only
  };
  static Result<ExpertLayout> standard_layout(const gguf::Model& model);
  static Result<ExpertLayout> packed_layout(const gguf::Model& model);
  Status check_expert_count(const gguf::Model& model, const std::string& tensor) const;
  bool packed_ = false;
  int64_t n_expert_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace magnetar::experts
