// Streaming GGUF writer, used by convert, quantize, pack and synth.
//
// Usage: add metadata and tensor infos (sizes are known from type and dims), begin() writes the header,
// then write() streams each tensor's bytes in the order the tensors were added (in as many pieces as the
// caller likes: a 16 GiB model never has to be in memory), and finish() pads, flushes, fsyncs and renames the
// temporary file onto the destination, then fsyncs the directory so that the rename survives a power loss.
// Until finish() succeeds the destination is untouched; a writer destroyed before that removes its temporary
// file, so a crash or a full disk never leaves a truncated model under the final name (a process killed
// outright leaves only DEST.tmp, which the next writer of DEST overwrites).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace magnetar::gguf {

class Writer {
 public:
  explicit Writer(std::string path, uint32_t version = 3);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Metadata, written in insertion order; setting a key again replaces its value in place. general.alignment (a u32
  // power of two) also sets the data layout's alignment: before any add_tensor (CHECKed).
  void set(const std::string& key, Value value);
  // Must be a power of two; recorded as general.alignment. Before any add_tensor (CHECKed).
  void set_alignment(uint32_t alignment);
  // dims in ggml order (innermost first). Fails on unknown type, bad dims or a duplicate name.
  Status add_tensor(const std::string& name, uint32_t type_id, std::span<const int64_t> dims);

  Status begin();
  // Appends bytes to the current tensor; crossing into the next tensor is allowed.
  Status write(std::span<const uint8_t> bytes);
  Status finish();
  // Optional, for outputs bigger than RAM: starts writeback of the bytes written so far and drops those that
  // already reached the disk from the page cache, so a long write does not evict the rest of the machine's
  // cache; once called, finish() drops the rest after its fsync. A hint (failures are ignored).
  void release_written();
  // Calls release_written() from write() each time `bytes` more have been written (0: never).
  void release_every(uint64_t bytes) { release_every_ = bytes; }
  static constexpr uint64_t kReleaseBytes = uint64_t(256) << 20;  // the interval pack and convert use

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  uint64_t bytes_written() const { return pos_; }

 private:
  Status put(const void* data, size_t n);
  Status put_value(const Value& v);
  Status put_string(const std::string& s);
  Status pad_to_alignment();

  std::string path_;
  std::string tmp_path_;
  uint32_t version_;
  uint32_t alignment_ = kDefaultAlignment;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_set<std::string> names_;  // of tensors_ (duplicates refused)
  uint64_t data_size_ = 0;
  std::FILE* file_ = nullptr;
  uint64_t pos_ = 0;          // bytes written so far
  uint64_t data_start_ = 0;   // absolute offset of the data section
  size_t current_ = 0;        // tensor being written
  uint64_t current_done_ = 0; // bytes of it written
  bool finished_ = false;
  int temp_handle_ = -1;            // tmp_path_'s entry in base/temp_files.h
  uint64_t writeback_started_ = 0;  // release_written(): bytes [0, this) have been handed to writeback
  uint64_t dropped_ = 0;            // and [0, this) dropped from the page cache
  uint64_t release_every_ = 0;      // release_every()
};

}  // namespace magnetar::gguf
