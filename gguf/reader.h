// GGUF reader: parses and validates a file's header, maps its data read-only, and presents a split set
// (name-00001-of-0000N.gguf with split.* keys) as one model.
//
// Hostile input never crashes or reads out of bounds: every count, length, dimension and offset is checked
// against the bytes actually present before it is used, and each failure is a Status naming the file, the
// field and the byte offset. Tensor data is zero-copy: TensorInfo::data points into the mapping, which lives
// as long as the GgufFile / Model that owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace magnetar::gguf {

// Everything before the tensor data of one file.
struct Header {
  uint32_t version = 0;
  std::vector<KeyValue> metadata;  // in file order
  std::vector<TensorInfo> tensors; // in file order; data == nullptr
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;        // absolute file offset of the data section

  const Value* find(std::string_view key) const;
};

// Parses the header in `bytes` (a whole file, or a prefix that contains at least the header) and checks
// every tensor's extent against `file_size`. `source` names the input in error messages.
Result<Header> parse_header(std::span<const uint8_t> bytes, uint64_t file_size, std::string_view source);

// One mapped file.
class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const Header& header() const { return header_; }
  // The whole file, mapped read-only: [0, size()).
  const uint8_t* bytes() const { return map_; }

 private:
  GgufFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  Header header_;
};

// A model: one GGUF file or a whole split set. Metadata comes from the first shard; tensors from all,
// with TensorInfo::data pointing into the right shard's mapping.
class Model {
 public:
  // Opens `path`; when it is the first shard of a split set, opens the other shards next to it.
  static Result<std::unique_ptr<Model>> open(const std::string& path);

  const std::vector<std::unique_ptr<GgufFile>>& shards() const { return shards_; }
  uint32_t version() const { return shards_[0]->header().version; }
  const std::vector<KeyValue>& metadata() const { return shards_[0]->header().metadata; }
  const Value* find(std::string_view key) const { return shards_[0]->header().find(key); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  uint64_t file_bytes() const;  // all shards
  // A 64-bit hash of what the model computes, for caches of its results (disk KV): every shard's header bytes
  // (metadata and tensor directory) and samples of every tensor's data, its first and last 4 KiB (all of it when
  // smaller). Another fine-tune or another quantization of one layout differs in the sampled weights. Reads
  // ~8 KiB per tensor through the mappings (two pages, from the disk when not cached).
  uint64_t fingerprint() const;
  // Whether `path` names one of its shards (the same file by device and inode, through links too): an output that
  // would replace its own input.
  bool has_file(const std::string& path) const;

  // Convenience readers for metadata; empty when absent or of another type.
  std::string get_string(std::string_view key) const;
  std::string architecture() const { return get_string("general.architecture"); }

 private:
  std::vector<std::unique_ptr<GgufFile>> shards_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
};

// "dir/name-00002-of-00005.gguf" for (prefix "dir/name", no 2, count 5): llama.cpp's split naming.
std::string split_path(std::string_view prefix, int no, int count);

}  // namespace magnetar::gguf
