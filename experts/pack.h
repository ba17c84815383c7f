// Packing: rewrites a standard (llama.cpp) MoE GGUF into the expert-major layout of layout.h, so that the
// expert store reads one whole expert with one aligned read; and verification of a packed file against its
// source, byte for byte.
//
// Packing copies bytes only (never requantizes) and streams: tensor data goes from the source mapping straight
// to the output file, a few MiB at a time, so memory use does not grow with the model. Pages already copied
// are dropped from the page cache (source and output), so packing a model bigger than RAM does not evict
// everything else on the machine. The output is written through gguf::Writer: a temporary file, fsync,
// atomic rename; the destination never holds a partial file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "experts/layout.h"
#include "gguf/reader.h"

namespace magnetar::experts {

struct PackedLayer {
  int64_t layer = 0;
  uint64_t expert_bytes = 0;   // gate + up + down of one expert
  uint64_t record_stride = 0;  // expert_bytes rounded up to kPackAlignment
};

// What packing a model produces, from its header alone (no tensor data is read).
struct PackPlan {
  ExpertLayout layout;              // of the source (standard)
  std::vector<PackedLayer> layers;  // in layer order
  uint64_t tensor_bytes_in = 0;     // tensor data of the source
  uint64_t expert_bytes = 0;        // routed experts, the same in both files
  uint64_t padding_bytes = 0;       // zeros that round each record up to its stride
  uint64_t table_bytes = 0;         // the extent table
};

// Fails (one line naming the file) when `src` is already packed or has no routed experts.
Result<PackPlan> plan_pack(const gguf::Model& src);

struct PackOptions {
  std::function<void(uint64_t done, uint64_t total)> progress;  // source tensor bytes copied, of the total
};

// Writes the packed form of `src` to `out_path`: metadata unchanged (split.* keys dropped: the output is one
// file) plus general.alignment = 4096 and the magnetar.pack.* keys; non-expert tensors unchanged and in order;
// each MoE layer's three stacked tensors replaced by its record tensor; the extent table last.
Status pack(const gguf::Model& src, const std::string& out_path, const PackOptions& options);

struct VerifyOptions {
  std::function<void(uint64_t done, uint64_t total)> progress;  // bytes compared, of the total
};

// Checks every byte of `packed` against `source`, the standard file it was packed from: same metadata (except
// the pack keys, general.alignment and split.*), same non-expert tensors in the same order with equal bytes,
// the same experts (part names, types, shapes), every (layer, expert, part) extent equal to the source's, and
// every record's padding zero. The error names the first difference: "layer 3 expert 17 part up: byte 4096
// differs (...)", "tensor 'output.weight': byte 12 differs", "metadata 'general.name': differs".
Status verify(const gguf::Model& packed, const gguf::Model& source, const VerifyOptions& options);

}  // namespace magnetar::experts
