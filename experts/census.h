// The popularity census: how often each routed expert (layer, expert) was needed, persisted next to the
// model (MODEL.gguf.census) and merged across runs, so a new run can load the hottest experts first.
//
// File (little-endian, version 1): "MGCENSUS" | u32 version | u64 model identity | u32 n_layer |
// u32 n_expert | u64 counts[n_layer * n_expert] | u64 FNV-1a of everything before it. Written to a
// temporary name, fsynced and renamed, so a reader sees the old file or the new one, never a torn one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/reader.h"

namespace magnetar::experts {

struct Census {
  int64_t n_layer = 0;
  int64_t n_expert = 0;
  std::vector<uint64_t> counts;  // [n_layer * n_expert]

  uint64_t total() const;
};

// Names one model file: a hash of its size and tensor directory (a repacked or requantized file is another
// model and starts a new census).
uint64_t model_identity(const gguf::Model& model);

// A missing file is an empty census (not an error). A file of another model, version or geometry, or a
// corrupted one, is an error naming the file and the problem (the caller warns and starts empty).
Result<Census> load_census(const std::string& path, uint64_t identity, int64_t n_layer, int64_t n_expert);
Status save_census(const std::string& path, uint64_t identity, const Census& census);

}  // namespace magnetar::experts
