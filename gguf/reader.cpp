#include "gguf/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "base/sha256.h"
#include "quant/quant.h"

namespace magnetar::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxNesting = 8;           // arrays of arrays deeper than this are refused (stack safety)
// Decoded metadata takes ~100 bytes per key or array element where the file may spend 1-13, so a hostile count that
// fits a large file could still ask for many times its size: these bound the header's memory to ~1 GB. A model's
// tokenizer (the largest arrays: 262,144 tokens, their scores and types, ~500,000 merges) needs a fraction of them.
constexpr uint64_t kMaxKeys = 1 << 16;
constexpr uint64_t kMaxArrayElements = 1 << 23;  // in all the header's arrays
constexpr uint64_t kMaxTensors = 1 << 20;

// ---- Cursor ------------------------------------------------------------------------------------------
// Bounds-checked little-endian reads with a sticky first error: after a failure every read returns zero
// and the error names the field and the byte offset where it happened.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, std::string_view source) : bytes_(bytes), source_(source) {}

  bool failed() const { return !error_.empty(); }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  // Counts n more array elements; false once the header's arrays hold more than kMaxArrayElements in all.
  bool count_elements(uint64_t n) {
    elements_ += n;
    return elements_ <= kMaxArrayElements;
  }
  Status status() const { return failed() ? Status::error(error_) : Status(); }

  void fail(const std::string& field, const std::string& problem, uint64_t at) {
    if (!failed()) error_ = format("%s: %s at byte %llu: %s", std::string(source_).c_str(), field.c_str(),
                                   (unsigned long long)at, problem.c_str());
  }

  template <typename T>
  T read(const std::string& field) {
    T v{};
    if (failed()) return v;
    if (remaining() < sizeof(T)) {
      fail(field, format("file ends (needs %zu bytes, %llu left)", sizeof(T), (unsigned long long)remaining()),
           pos_);
      return v;
    }
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // u64 length + bytes (v2/v3 strings).
  std::string read_string(const std::string& field) {
    const uint64_t at = pos_;
    const uint64_t n = read<uint64_t>(field + " length");
    if (failed()) return {};
    if (n > remaining()) {
      fail(field, format("string length %llu exceeds the %llu bytes left in the file", (unsigned long long)n,
                         (unsigned long long)remaining()),
           at);
      return {};
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(n));
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  std::string_view source_;
  uint64_t pos_ = 0;
  uint64_t elements_ = 0;
  std::string error_;
};

// Smallest encoding of one value of `type`: used to reject counts the remaining bytes cannot hold
// before allocating anything for them.
uint64_t min_encoded_size(ValueType type) {
  switch (type) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: case ValueType::kString: return 8;
    case ValueType::kArray: return 12;
  }
  return 1;
}

Value read_value(Cursor& c, ValueType type, const std::string& field, int depth) {
  switch (type) {
    case ValueType::kUint8: return Value::of_uint(type, c.read<uint8_t>(field));
    case ValueType::kInt8: return Value::of_int(type, c.read<int8_t>(field));
    case ValueType::kUint16: return Value::of_uint(type, c.read<uint16_t>(field));
    case ValueType::kInt16: return Value::of_int(type, c.read<int16_t>(field));
    case ValueType::kUint32: return Value::of_uint(type, c.read<uint32_t>(field));
    case ValueType::kInt32: return Value::of_int(type, c.read<int32_t>(field));
    case ValueType::kUint64: return Value::of_uint(type, c.read<uint64_t>(field));
    case ValueType::kInt64: return Value::of_int(type, c.read<int64_t>(field));
    case ValueType::kFloat32: return Value::of_float(type, c.read<float>(field));
    case ValueType::kFloat64: return Value::of_float(type, c.read<double>(field));
    case ValueType::kBool: {
      const uint64_t at = c.pos();
      const uint8_t b = c.read<uint8_t>(field);
      if (b > 1) c.fail(field, format("bool value %u is not 0 or 1", b), at);
      return Value::of_bool(b != 0);
    }
    case ValueType::kString: return Value::of_string(c.read_string(field));
    case ValueType::kArray: {
      const uint64_t at = c.pos();
      const uint32_t elem = c.read<uint32_t>(field + " element type");
      const uint64_t n = c.read<uint64_t>(field + " element count");
      if (c.failed()) return {};
      if (elem >= kValueTypeCount) {
        c.fail(field, format("unknown array element type %u", elem), at);
        return {};
      }
      if (ValueType(elem) == ValueType::kArray && depth >= kMaxNesting) {
        c.fail(field, format("arrays nested deeper than %d levels", kMaxNesting), at);
        return {};
      }
      if (n > c.remaining() / min_encoded_size(ValueType(elem))) {
        c.fail(field, format("array of %llu %s values cannot fit in the %llu bytes left", (unsigned long long)n,
                             value_type_name(ValueType(elem)).data(), (unsigned long long)c.remaining()),
               at + 4);
        return {};
      }
      if (!c.count_elements(n)) {
        c.fail(field,
               format("the metadata's arrays hold more than %llu elements in all (a model needs far fewer)",
                      (unsigned long long)kMaxArrayElements),
               at + 4);
        return {};
      }
      std::vector<Value> items;
      items.reserve(size_t(std::min<uint64_t>(n, 1 << 16)));
      for (uint64_t k = 0; k < n && !c.failed(); ++k) {
        items.push_back(read_value(c, ValueType(elem), field, depth + 1));
      }
      return Value::of_array(ValueType(elem), std::move(items));
    }
  }
  return {};
}

uint32_t bswap32(uint32_t v) { return __builtin_bswap32(v); }

}  // namespace

// ---- Header parsing --------------------------------------------------------------------------------------

const Value* Header::find(std::string_view key) const {
  for (const KeyValue& kv : metadata) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

Result<Header> parse_header(std::span<const uint8_t> bytes, uint64_t file_size, std::string_view source) {
  Cursor c(bytes, source);
  Header h;
  const uint32_t magic = c.read<uint32_t>("magic");
  if (c.failed()) return c.status();
  if (magic != kMagic) {
    c.fail("magic", format("not a GGUF file (magic 0x%08x, expected \"GGUF\")", magic), 0);
    return c.status();
  }
  h.version = c.read<uint32_t>("version");
  if (c.failed()) return c.status();
  if (h.version != 2 && h.version != 3) {
    const uint32_t swapped = bswap32(h.version);
    if (swapped >= 1 && swapped <= 3) {
      c.fail("version", "big-endian GGUF files are not supported (convert it on a little-endian machine)", 4);
    } else if (h.version == 1) {
      c.fail("version", "GGUF v1 is not supported (re-convert the model with a current converter)", 4);
    } else {
      c.fail("version", format("unsupported GGUF version %u (supported: 2, 3)", h.version), 4);
    }
    return c.status();
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (c.failed()) return c.status();
  // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8 + 4 + 4 + 8.
  if (n_kv > c.remaining() / 13) {
    c.fail("metadata count", format("%llu entries cannot fit in the file", (unsigned long long)n_kv), 16);
    return c.status();
  }
  if (n_tensors > c.remaining() / 24) {
    c.fail("tensor count", format("%llu tensors cannot fit in the file", (unsigned long long)n_tensors), 8);
    return c.status();
  }
  if (n_kv > kMaxKeys) {
    c.fail("metadata count",
           format("%llu entries, more than the %llu read", (unsigned long long)n_kv, (unsigned long long)kMaxKeys), 16);
    return c.status();
  }
  if (n_tensors > kMaxTensors) {
    c.fail(
        "tensor count",
        format("%llu tensors, more than the %llu read", (unsigned long long)n_tensors, (unsigned long long)kMaxTensors),
        8);
    return c.status();
  }

  h.metadata.reserve(size_t(n_kv));
  std::unordered_set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    KeyValue kv;
    kv.key = c.read_string(format("metadata key #%llu", (unsigned long long)k));
    const std::string field = "metadata '" + kv.key + "'";
    const uint64_t type_at = c.pos();
    const uint32_t type = c.read<uint32_t>(field + " type");
    if (c.failed()) return c.status();
    if (type >= kValueTypeCount) {
      c.fail(field, format("unknown value type %u", type), type_at);
      return c.status();
    }
    kv.value = read_value(c, ValueType(type), field, 0);
    if (c.failed()) return c.status();
    if (!keys.insert(kv.key).second) {
      c.fail(field, "duplicate key", at);
      return c.status();
    }
    h.metadata.push_back(std::move(kv));
  }

  if (const Value* a = h.find("general.alignment")) {
    const std::optional<uint64_t> v = a->as_uint();
    if (a->type != ValueType::kUint32 || !v || *v == 0 || (*v & (*v - 1)) != 0) {
      return Status::error(format("%s: metadata 'general.alignment': must be a u32 power of two, got %s %s",
                                  std::string(source).c_str(), value_type_name(a->type).data(),
                                  a->to_string().c_str()));
    }
    h.alignment = uint32_t(*v);
  }

  h.tensors.reserve(size_t(std::min<uint64_t>(n_tensors, 1 << 16)));
  std::unordered_set<std::string> names;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    const uint64_t at = c.pos();
    TensorInfo info;
    info.name = c.read_string(format("tensor #%llu name", (unsigned long long)t));
    const std::string field = "tensor '" + info.name + "'";
    const uint64_t dims_at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>(field + " n_dims");
    if (c.failed()) return c.status();
    if (n_dims == 0 || n_dims > uint32_t(kMaxDims)) {
      c.fail(field, format("n_dims %u out of range 1..%d", n_dims, kMaxDims), dims_at);
      return c.status();
    }
    info.n_dims = int(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>(field + " dims");
      if (ne > uint64_t(INT64_MAX)) c.fail(field, format("dimension %u is negative", d), dims_at + 4 + 8 * d);
      info.ne[d] = int64_t(ne);
    }
    const uint64_t type_at = c.pos();
    info.type_id = c.read<uint32_t>(field + " type");
    const uint64_t offset_at = c.pos();
    info.offset = c.read<uint64_t>(field + " offset");
    if (c.failed()) return c.status();
    std::string problem;
    const std::optional<uint64_t> nbytes = tensor_nbytes(info.type_id, info.ne, &problem);
    if (!nbytes) {
      c.fail(field, problem, problem.find("type") != std::string::npos ? type_at : dims_at);
      return c.status();
    }
    info.nbytes = *nbytes;
    if (info.offset % h.alignment != 0) {
      c.fail(field, format("data offset %llu is not a multiple of the alignment %u",
                           (unsigned long long)info.offset, h.alignment),
             offset_at);
      return c.status();
    }
    if (!names.insert(info.name).second) {
      c.fail(field, "duplicate tensor name", at);
      return c.status();
    }
    h.tensors.push_back(std::move(info));
  }

  h.data_offset = (c.pos() + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_offset > file_size && !h.tensors.empty()) {
    return Status::error(format("%s: data section at byte %llu: file ends at %llu", std::string(source).c_str(),
                                (unsigned long long)h.data_offset, (unsigned long long)file_size));
  }
  // A shard of metadata only need not pad to the alignment (llama.cpp reads it): its data section is empty.
  h.data_offset = std::min(h.data_offset, file_size);
  const uint64_t data_size = file_size >= h.data_offset ? file_size - h.data_offset : 0;
  // Extents: inside the file and pairwise disjoint.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : h.tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return Status::error(format("%s: tensor '%s' data [%llu, +%llu) at byte %llu: past the end of the file "
                                  "(%llu data bytes)",
                                  std::string(source).c_str(), t.name.c_str(), (unsigned long long)t.offset,
                                  (unsigned long long)t.nbytes, (unsigned long long)(h.data_offset + t.offset),
                                  (unsigned long long)data_size));
    }
    by_offset.push_back(&t);
  }
  // A tensor of no bytes may share its offset with the next one (llama.cpp's layout): it sorts first.
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = *by_offset[k - 1];
    if (prev.offset + prev.nbytes > by_offset[k]->offset) {
      return Status::error(format("%s: tensor '%s' data at byte %llu: overlaps tensor '%s'",
                                  std::string(source).c_str(), by_offset[k]->name.c_str(),
                                  (unsigned long long)(h.data_offset + by_offset[k]->offset), prev.name.c_str()));
    }
  }
  return h;
}

// ---- GgufFile ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(format("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(format("%s: not a regular file", path.c_str()));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = uint64_t(st.st_size);
  if (file->size_ == 0) {
    ::close(fd);
    return Status::error(format("%s: magic at byte 0: file is empty", path.c_str()));
  }
  void* map = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::error(format("%s: mmap failed: %s", path.c_str(), std::strerror(errno)));
  file->map_ = static_cast<const uint8_t*>(map);

  Result<Header> header = parse_header({file->map_, file->size_}, file->size_, path);
  if (!header.ok()) return header.status();
  file->header_ = std::move(header).value();
  for (TensorInfo& t : file->header_.tensors) t.data = file->map_ + file->header_.data_offset + t.offset;
  return file;
}

GgufFile::~GgufFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), size_);
}

// ---- Model (split sets) ------------------------------------------------------------------------------------

std::string split_path(std::string_view prefix, int no, int count) {
  return format("%s-%05d-of-%05d.gguf", std::string(prefix).c_str(), no, count);
}

namespace {

// The split.* keys of one shard; count 0 when the file is not part of a split set.
struct SplitKeys {
  uint64_t no = 0;
  uint64_t count = 0;
  uint64_t tensors = 0;
};

Result<SplitKeys> split_keys(const GgufFile& f) {
  SplitKeys s;
  const Value* count = f.header().find("split.count");
  if (!count) return s;
  const Value* no = f.header().find("split.no");
  const Value* tensors = f.header().find("split.tensors.count");
  if (!count->as_uint() || !no || !no->as_uint() || !tensors || !tensors->as_uint()) {
    return Status::error(format("%s: metadata 'split.*': split.count, split.no and split.tensors.count must all "
                                "be non-negative integers",
                                f.path().c_str()));
  }
  s = {.no = *no->as_uint(), .count = *count->as_uint(), .tensors = *tensors->as_uint()};
  if (s.count == 0 || s.count > 99999 || s.no >= s.count) {
    return Status::error(format("%s: metadata 'split.no': shard %llu of %llu is out of range", f.path().c_str(),
                                (unsigned long long)s.no, (unsigned long long)s.count));
  }
  return s;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::open(const std::string& path) {
  Result<std::unique_ptr<GgufFile>> first = GgufFile::open(path);
  if (!first.ok()) return first.status();
  Result<SplitKeys> split = split_keys(*first.value());
  if (!split.ok()) return split.status();

  std::unique_ptr<Model> model(new Model());
  model->shards_.push_back(std::move(first).value());
  if (split->count > 1) {
    if (split->no != 0) {
      return Status::error(format("%s: this is shard %llu of a %llu-file split model: open the first shard "
                                  "(…-00001-of-%05llu.gguf)",
                                  path.c_str(), (unsigned long long)split->no + 1, (unsigned long long)split->count,
                                  (unsigned long long)split->count));
    }
    const std::string suffix = format("-00001-of-%05llu.gguf", (unsigned long long)split->count);
    if (path.size() < suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return Status::error(format("%s: split model with %llu shards, but the file name does not end in '%s'",
                                  path.c_str(), (unsigned long long)split->count, suffix.c_str()));
    }
    const std::string prefix = path.substr(0, path.size() - suffix.size());
    for (uint64_t k = 1; k < split->count; ++k) {
      const std::string shard_path = split_path(prefix, int(k + 1), int(split->count));
      Result<std::unique_ptr<GgufFile>> shard = GgufFile::open(shard_path);
      if (!shard.ok()) return shard.status();
      Result<SplitKeys> keys = split_keys(*shard.value());
      if (!keys.ok()) return keys.status();
      if (keys->no != k || keys->count != split->count) {
        return Status::error(format("%s: metadata 'split.no': says shard %llu of %llu, expected %llu of %llu",
                                    shard_path.c_str(), (unsigned long long)keys->no + 1,
                                    (unsigned long long)keys->count, (unsigned long long)k + 1,
                                    (unsigned long long)split->count));
      }
      model->shards_.push_back(std::move(shard).value());
    }
  }

  for (size_t s = 0; s < model->shards_.size(); ++s) {
    for (TensorInfo t : model->shards_[s]->header().tensors) {
      t.shard = uint32_t(s);
      if (!model->by_name_.emplace(t.name, model->tensors_.size()).second) {
        return Status::error(format("%s: tensor '%s': also present in an earlier shard",
                                    model->shards_[s]->path().c_str(), t.name.c_str()));
      }
      model->tensors_.push_back(std::move(t));
    }
  }
  if (split->count > 1 && model->tensors_.size() != split->tensors) {
    return Status::error(format("%s: metadata 'split.tensors.count': says %llu tensors, the shards hold %zu",
                                path.c_str(), (unsigned long long)split->tensors, model->tensors_.size()));
  }
  return model;
}

const TensorInfo* Model::find_tensor(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Model::file_bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards_) n += s->size();
  return n;
}

bool Model::has_file(const std::string& path) const {
  struct stat want;
  if (::stat(path.c_str(), &want) != 0) return false;
  for (const auto& s : shards_) {
    struct stat st;
    if (::stat(s->path().c_str(), &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino) return true;
  }
  return false;
}

uint64_t Model::fingerprint() const {
  constexpr uint64_t kSample = 4096;
  Sha256 h;
  for (const auto& s : shards_) h.update(s->bytes(), size_t(s->header().data_offset));
  for (const TensorInfo& t : tensors_) {
    if (t.nbytes <= 2 * kSample) {
      h.update(t.data, size_t(t.nbytes));
    } else {
      h.update(t.data, kSample);
      h.update(t.data + t.nbytes - kSample, kSample);
    }
  }
  const std::array<uint8_t, 32> digest = h.finish();
  uint64_t v;
  std::memcpy(&v, digest.data(), sizeof(v));
  return v;
}

std::string Model::get_string(std::string_view key) const {
  const Value* v = find(key);
  return v && v->is_string() ? v->str : std::string();
}

}  // namespace magnetar::gguf
