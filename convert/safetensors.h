// Safetensors reader: the weight format of Hugging Face model folders, mapped read-only.
//
// A file is: u64 little-endian N, N bytes of JSON header, then the data buffer. The header maps each tensor
// name to {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]} (offsets relative to the
// data buffer) and may hold "__metadata__": {string: string}. Following the format's specification, the
// tensors must tile the data buffer exactly: no overlaps, no holes, no bytes past the last tensor.
//
// Hostile input never crashes or reads out of bounds: the header length, every dtype, shape and offset pair
// is checked against the bytes present before use, and each failure is a one-line Status naming the file,
// the tensor and the field. Tensor data is zero-copy: SafeTensor::data points into the mapping, which lives
// as long as the SafetensorsFile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace magnetar::convert {

// The element types of the safetensors specification that occupy whole bytes.
enum class Dtype { kBool, kU8, kI8, kF8E5M2, kF8E4M3, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64 };

std::string_view dtype_name(Dtype dtype);  // "BF16", as in the header
size_t dtype_size(Dtype dtype);            // bytes per element
std::optional<Dtype> dtype_from_name(std::string_view name);

struct SafeTensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;  // PyTorch order: outermost first (ggml order is this reversed)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string_view file;  // the file's name (no directory), for messages; owned by the SafetensorsFile
  bool mapped = false;    // data lies in a file mapping (open), not in a caller's buffer (parse)

  int64_t n_elements() const;  // 1 for a scalar (shape [])
};

// Paging hints for a tensor's bytes, no-ops unless `mapped`: prefetch before reading it, and drop its pages
// from this process once done, so converting a model larger than RAM keeps the resident set near one
// tensor. Dropping is always safe (a later read faults the pages back in from the file).
void advise_will_need(const SafeTensor& t);
void advise_done(const SafeTensor& t);

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. Messages name the file by `path`.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates the header of in-memory file contents (tests, fuzzing). `bytes` must outlive the result.
  static Result<std::unique_ptr<SafetensorsFile>> parse(std::span<const uint8_t> bytes, std::string name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& name() const { return name_; }                    // file name without directory
  const std::vector<SafeTensor>& tensors() const { return tensors_; }  // in data-offset order
  const SafeTensor* find(std::string_view name) const;                 // nullptr when absent
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status parse_header(std::span<const uint8_t> bytes, const std::string& source);

  std::string name_;
  const uint8_t* map_ = nullptr;  // owned mapping (open) or nullptr (parse)
  uint64_t map_size_ = 0;
  std::vector<SafeTensor> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// Headers larger than this are refused before parsing (the safetensors library uses the same bound).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace magnetar::convert
