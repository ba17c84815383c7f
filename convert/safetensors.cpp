#include "convert/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "convert/json_util.h"

namespace magnetar::convert {
namespace {

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1},      {Dtype::kU8, "U8", 1},   {Dtype::kI8, "I8", 1},   {Dtype::kF8E5M2, "F8_E5M2", 1},
    {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kI16, "I16", 2}, {Dtype::kU16, "U16", 2}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},      {Dtype::kI32, "I32", 4}, {Dtype::kU32, "U32", 4}, {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},        {Dtype::kI64, "I64", 8}, {Dtype::kU64, "U64", 8},
};

const DtypeInfo& info(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[0];  // unreachable: every enumerator has a row
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string_view dtype_name(Dtype dtype) { return info(dtype).name; }
size_t dtype_size(Dtype dtype) { return info(dtype).size; }

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

namespace {
// The page-aligned range covering a tensor's bytes (rounded outward: neighbours' pages are only hinted).
std::pair<void*, size_t> page_range(const SafeTensor& t) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t head = size_t(reinterpret_cast<uintptr_t>(t.data) % page);
  const size_t len = (head + t.nbytes + page - 1) / page * page;
  return {const_cast<uint8_t*>(t.data - head), len};
}
}  // namespace

void advise_will_need(const SafeTensor& t) {
  if (!t.mapped || t.nbytes == 0) return;
  const auto [addr, len] = page_range(t);
  madvise(addr, len, MADV_WILLNEED);  // a hint: failure changes nothing but speed
}

void advise_done(const SafeTensor& t) {
  if (!t.mapped || t.nbytes == 0) return;
  const auto [addr, len] = page_range(t);
  madvise(addr, len, MADV_DONTNEED);  // read-only file mapping: pages come back from the file if touched
}

int64_t SafeTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // shapes were checked for overflow when the header was parsed
  return n;
}

// ---- SafetensorsFile -------------------------------------------------------------------------------------

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(format("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(format("%s: not a regular file", path.c_str()));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->name_ = base_name(path);
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Status::error(
        format("%s: header length at byte 0: file has only %llu bytes", path.c_str(), (unsigned long long)size));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::error(format("%s: mmap failed: %s", path.c_str(), std::strerror(errno)));
  file->map_ = static_cast<const uint8_t*>(map);
  file->map_size_ = size;
  MAGNETAR_RETURN_IF_ERROR(file->parse_header({file->map_, size}, path));
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->name_ = std::move(name);
  MAGNETAR_RETURN_IF_ERROR(file->parse_header(bytes, file->name_));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

const SafeTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::parse_header(std::span<const uint8_t> bytes, const std::string& source) {
  const char* src = source.c_str();
  if (bytes.size() < 8) {
    return Status::error(format("%s: header length at byte 0: file has only %zu bytes", src, bytes.size()));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[size_t(i)];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    return Status::error(format("%s: header length at byte 0: %llu bytes exceeds the %llu-byte limit", src,
                                (unsigned long long)header_len, (unsigned long long)kMaxHeaderBytes));
  }
  if (header_len > bytes.size() - 8) {
    return Status::error(format("%s: header length at byte 0: %llu bytes but only %zu follow (truncated file?)", src,
                                (unsigned long long)header_len, bytes.size() - 8));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), size_t(header_len));
  Result<Json> parsed = parse_json(text, source + ": header", /*max_depth=*/4, /*unique_keys=*/true);
  if (!parsed.ok()) return parsed.status();
  const Json& header = parsed.value();
  if (!header.is_object()) return Status::error(format("%s: header: not a JSON object", src));

  const uint8_t* data = bytes.data() + 8 + header_len;
  const uint64_t data_size = bytes.size() - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return Status::error(format("%s: header: '__metadata__' is not an object", src));
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return Status::error(format("%s: header: __metadata__ '%s' is not a string", src, m.key().c_str()));
        }
        metadata_.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const char* tn = name.c_str();
    if (!entry.is_object()) return Status::error(format("%s: tensor '%s': entry is not an object", src, tn));
    SafeTensor t;
    t.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return Status::error(format("%s: tensor '%s': dtype is missing or not a string", src, tn));
    }
    const std::string dtype_str = dtype_it->get<std::string>();
    const std::optional<Dtype> dtype = dtype_from_name(dtype_str);
    if (!dtype) return Status::error(format("%s: tensor '%s': dtype '%s' is unknown", src, tn, dtype_str.c_str()));
    t.dtype = *dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return Status::error(format("%s: tensor '%s': shape is missing or not an array", src, tn));
    }
    // Element count with overflow checks: each dimension and the running product stay below 2^62.
    uint64_t n_elements = 1;
    for (const Json& d : *shape_it) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return Status::error(
            format("%s: tensor '%s': shape has a dimension that is not a non-negative integer", src, tn));
      }
      const uint64_t v = d.get<uint64_t>();
      if (v >= (1ull << 62) || (v != 0 && n_elements > (1ull << 62) / v)) {
        return Status::error(format("%s: tensor '%s': shape %s overflows", src, tn, shape_it->dump().c_str()));
      }
      n_elements *= v;
      t.shape.push_back(int64_t(v));
    }

    const auto off_it = entry.find("data_offsets");
    if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 || !(*off_it)[0].is_number_unsigned() ||
        !(*off_it)[1].is_number_unsigned()) {
      return Status::error(format("%s: tensor '%s': data_offsets is not a pair of non-negative integers", src, tn));
    }
    const uint64_t begin = (*off_it)[0].get<uint64_t>(), end = (*off_it)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Status::error(format("%s: tensor '%s': data_offsets [%llu, %llu] outside the %llu-byte data buffer", src,
                                  tn, (unsigned long long)begin, (unsigned long long)end,
                                  (unsigned long long)data_size));
    }
    // Bounding the element count by the buffer size (< 2^61 for any mappable file) keeps the byte count
    // below 2^64 for dtypes of up to 8 bytes.
    if (n_elements > data_size) {
      return Status::error(format("%s: tensor '%s': shape %s has more elements than the data buffer has bytes", src, tn,
                                  shape_string(t.shape).c_str()));
    }
    const uint64_t expected = n_elements * dtype_size(t.dtype);
    if (end - begin != expected) {
      return Status::error(format("%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets span %llu", src,
                                  tn, shape_string(t.shape).c_str(), dtype_str.c_str(), (unsigned long long)expected,
                                  (unsigned long long)(end - begin)));
    }
    t.data = data + begin;
    t.nbytes = expected;
    t.file = name_;
    t.mapped = map_ != nullptr;
    tensors_.push_back(std::move(t));
  }

  // The specification's tiling rule: sorted by offset, each tensor starts where the previous one ended and
  // the last one ends at the end of the file. This refuses overlapping tensors and hidden bytes alike.
  // Zero-byte tensors sort before a tensor starting at the same offset.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensor& a, const SafeTensor& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  uint64_t expected_begin = 0;
  for (const SafeTensor& t : tensors_) {
    const uint64_t begin = uint64_t(t.data - data);
    if (begin != expected_begin) {
      return Status::error(format("%s: tensor '%s': data_offsets begin at %llu, expected %llu (%s)", src,
                                  t.name.c_str(), (unsigned long long)begin, (unsigned long long)expected_begin,
                                  begin < expected_begin ? "overlaps the previous tensor" : "hole in the data buffer"));
    }
    expected_begin = begin + t.nbytes;
  }
  if (expected_begin != data_size) {
    return Status::error(format("%s: data buffer has %llu bytes after the last tensor (at data offset %llu)", src,
                                (unsigned long long)(data_size - expected_begin), (unsigned long long)expected_begin));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  return Status();
}

}  // namespace magnetar::convert
