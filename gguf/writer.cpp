#include "gguf/writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/temp_files.h"

namespace magnetar::gguf {
namespace {

// The directory a path's file is in ("." for a bare name).
std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Writer::Writer(std::string path, uint32_t version)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), version_(version) {
  MAGNETAR_CHECK(version == 2 || version == 3);
}

Writer::~Writer() {
  temp_files::forget(temp_handle_);
  // Removed while still locked: once closed, another job may take the name.
  if (!finished_ && pos_ > 0) std::remove(tmp_path_.c_str());
  if (file_) std::fclose(file_);
}

void Writer::set(const std::string& key, Value value) {
  // The layout follows the alignment the file states (a value the reader refuses is written as given: tests make
  // bad files so); tensor offsets are computed with it, so it is set before the first tensor.
  if (key == "general.alignment" && value.type == ValueType::kUint32 && value.u != 0 &&
      (value.u & (value.u - 1)) == 0) {
    MAGNETAR_CHECK(file_ == nullptr && tensors_.empty());
    alignment_ = uint32_t(value.u);
  }
  for (KeyValue& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back({key, std::move(value)});
}

void Writer::set_alignment(uint32_t alignment) {
  MAGNETAR_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0);
  set("general.alignment", Value::of_uint(ValueType::kUint32, alignment));
}

Status Writer::add_tensor(const std::string& name, uint32_t type_id, std::span<const int64_t> dims) {
  MAGNETAR_CHECK(file_ == nullptr);
  if (dims.empty() || dims.size() > size_t(kMaxDims)) {
    return Status::error(format("%s: tensor '%s': %zu dims (1..%d allowed)", path_.c_str(), name.c_str(),
                                dims.size(), kMaxDims));
  }
  if (!names_.insert(name).second) {
    return Status::error(format("%s: tensor '%s': duplicate name", path_.c_str(), name.c_str()));
  }
  TensorInfo info;
  info.name = name;
  info.type_id = type_id;
  info.n_dims = int(dims.size());
  std::copy(dims.begin(), dims.end(), info.ne.begin());
  std::string problem;
  const std::optional<uint64_t> nbytes = tensor_nbytes(type_id, info.ne, &problem);
  if (!nbytes) return Status::error(format("%s: tensor '%s': %s", path_.c_str(), name.c_str(), problem.c_str()));
  info.nbytes = *nbytes;
  info.offset = data_size_;
  data_size_ += (info.nbytes + alignment_ - 1) / alignment_ * alignment_;
  tensors_.push_back(std::move(info));
  return Status();
}

Status Writer::put(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, file_) != n) {
    return Status::error(format("%s: write failed at byte %llu: %s", tmp_path_.c_str(), (unsigned long long)pos_,
                                std::strerror(errno)));
  }
  pos_ += n;
  return Status();
}

Status Writer::put_string(const std::string& s) {
  const uint64_t n = s.size();
  MAGNETAR_RETURN_IF_ERROR(put(&n, 8));
  return put(s.data(), s.size());
}

Status Writer::put_value(const Value& v) {
  switch (v.type) {
    case ValueType::kUint8: case ValueType::kBool: { const uint8_t x = uint8_t(v.u); return put(&x, 1); }
    case ValueType::kInt8: { const int8_t x = int8_t(v.i); return put(&x, 1); }
    case ValueType::kUint16: { const uint16_t x = uint16_t(v.u); return put(&x, 2); }
    case ValueType::kInt16: { const int16_t x = int16_t(v.i); return put(&x, 2); }
    case ValueType::kUint32: { const uint32_t x = uint32_t(v.u); return put(&x, 4); }
    case ValueType::kInt32: { const int32_t x = int32_t(v.i); return put(&x, 4); }
    case ValueType::kUint64: return put(&v.u, 8);
    case ValueType::kInt64: return put(&v.i, 8);
    case ValueType::kFloat32: { const float x = float(v.f); return put(&x, 4); }
    case ValueType::kFloat64: return put(&v.f, 8);
    case ValueType::kString: return put_string(v.str);
    case ValueType::kArray: {
      const uint32_t elem = uint32_t(v.array_type);
      const uint64_t n = v.array.size();
      MAGNETAR_RETURN_IF_ERROR(put(&elem, 4));
      MAGNETAR_RETURN_IF_ERROR(put(&n, 8));
      for (const Value& item : v.array) {
        MAGNETAR_CHECK(item.type == v.array_type);
        MAGNETAR_RETURN_IF_ERROR(put_value(item));
      }
      return Status();
    }
  }
  return Status();
}

Status Writer::pad_to_alignment() {
  static const uint8_t kZeros[256] = {};
  // alignment may exceed the zero buffer: write in pieces
  while (pos_ % alignment_ != 0) {
    const uint64_t need = alignment_ - pos_ % alignment_;
    MAGNETAR_RETURN_IF_ERROR(put(kZeros, size_t(std::min<uint64_t>(need, sizeof(kZeros)))));
  }
  return Status();
}

Status Writer::begin() {
  MAGNETAR_CHECK(file_ == nullptr);
  // Checked first: the rename at the end would fail after all the work (a directory), or the disk fill up midway.
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::error(format("%s: is a directory (the output must be a file name)", path_.c_str()));
  }
  const std::string dir = directory_of(tmp_path_);
  struct statvfs fs;
  uint64_t reused = 0;  // a temporary left by a killed job is truncated: its bytes come back
  if (::stat(tmp_path_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) reused = uint64_t(st.st_size);
  const uint64_t need = data_size_;  // and the header, small beside it
  if (::statvfs(dir.c_str(), &fs) == 0 && fs.f_frsize > 0) {
    const uint64_t free_bytes = uint64_t(fs.f_bavail) * uint64_t(fs.f_frsize) + reused;
    if (free_bytes < need) {
      return Status::error(format("%s: needs %.2f GiB or more, %.2f GiB free in %s", path_.c_str(),
                                  double(need) / double(1ull << 30), double(free_bytes) / double(1ull << 30),
                                  dir.c_str()));
    }
  }
  // The temporary is locked while it is written and renamed: a second job writing the same output fails here instead
  // of truncating the first one's file under it (a temporary left by a killed job holds no lock and is reused). A
  // lock taken on a file that its writer renamed away meanwhile (opened just before the rename, locked just after
  // the close) is of a finished output: the name is opened again.
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::error(format("%s: cannot create: %s", tmp_path_.c_str(), std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return Status::error(format("%s: another job is writing it (%s is locked)", path_.c_str(), tmp_path_.c_str()));
    }
    struct stat locked, named;
    if (::fstat(fd, &locked) == 0 && ::stat(tmp_path_.c_str(), &named) == 0 && locked.st_dev == named.st_dev &&
        locked.st_ino == named.st_ino) {
      break;
    }
    ::close(fd);
    fd = -1;
    if (attempt == 8) return Status::error(format("%s: %s keeps being replaced", path_.c_str(), tmp_path_.c_str()));
  }
  temp_handle_ = temp_files::add(tmp_path_);  // an interrupted process removes it (base/temp_files.h)
  if (::ftruncate(fd, 0) != 0 || !(file_ = ::fdopen(fd, "wb"))) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::error(format("%s: cannot create: %s", tmp_path_.c_str(), why.c_str()));
  }
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 22);
  const uint32_t magic = 0x46554747;
  const uint64_t n_tensors = tensors_.size();
  const uint64_t n_kv = metadata_.size();
  MAGNETAR_RETURN_IF_ERROR(put(&magic, 4));
  MAGNETAR_RETURN_IF_ERROR(put(&version_, 4));
  MAGNETAR_RETURN_IF_ERROR(put(&n_tensors, 8));
  MAGNETAR_RETURN_IF_ERROR(put(&n_kv, 8));
  for (const KeyValue& kv : metadata_) {
    MAGNETAR_RETURN_IF_ERROR(put_string(kv.key));
    const uint32_t type = uint32_t(kv.value.type);
    MAGNETAR_RETURN_IF_ERROR(put(&type, 4));
    MAGNETAR_RETURN_IF_ERROR(put_value(kv.value));
  }
  for (const TensorInfo& t : tensors_) {
    MAGNETAR_RETURN_IF_ERROR(put_string(t.name));
    const uint32_t n_dims = uint32_t(t.n_dims);
    MAGNETAR_RETURN_IF_ERROR(put(&n_dims, 4));
    for (int d = 0; d < t.n_dims; ++d) MAGNETAR_RETURN_IF_ERROR(put(&t.ne[d], 8));
    MAGNETAR_RETURN_IF_ERROR(put(&t.type_id, 4));
    MAGNETAR_RETURN_IF_ERROR(put(&t.offset, 8));
  }
  MAGNETAR_RETURN_IF_ERROR(pad_to_alignment());
  data_start_ = pos_;
  return Status();
}

Status Writer::write(std::span<const uint8_t> bytes) {
  MAGNETAR_CHECK(file_ != nullptr);
  while (!bytes.empty()) {
    if (current_ >= tensors_.size()) {
      return Status::error(format("%s: %zu bytes written past the last tensor", path_.c_str(), bytes.size()));
    }
    const TensorInfo& t = tensors_[current_];
    const uint64_t take = std::min<uint64_t>(bytes.size(), t.nbytes - current_done_);
    MAGNETAR_RETURN_IF_ERROR(put(bytes.data(), size_t(take)));
    bytes = bytes.subspan(size_t(take));
    current_done_ += take;
    if (current_done_ == t.nbytes) {
      MAGNETAR_RETURN_IF_ERROR(pad_to_alignment());
      ++current_;
      current_done_ = 0;
    }
  }
  if (release_every_ > 0 && pos_ - writeback_started_ >= release_every_) release_written();
  return Status();
}

Status Writer::finish() {
  MAGNETAR_CHECK(file_ != nullptr);
  // zero-byte tensors complete without a write() call
  while (current_ < tensors_.size() && tensors_[current_].nbytes == 0 && current_done_ == 0) ++current_;
  if (current_ != tensors_.size()) {
    return Status::error(format("%s: tensor '%s': only %llu of %llu bytes written", path_.c_str(),
                                tensors_[current_].name.c_str(), (unsigned long long)current_done_,
                                (unsigned long long)tensors_[current_].nbytes));
  }
  MAGNETAR_CHECK(pos_ == data_start_ + data_size_);
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    return Status::error(format("%s: flush failed: %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  // A writer that released pages as it went (release_written) drops the rest too, now that it is on disk.
  if (writeback_started_ > 0) (void)posix_fadvise(fileno(file_), 0, 0, POSIX_FADV_DONTNEED);
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {  // still locked (closing would let another job in)
    return Status::error(format("%s: cannot rename from %s: %s", path_.c_str(), tmp_path_.c_str(),
                                std::strerror(errno)));
  }
  finished_ = true;
  temp_files::forget(temp_handle_);
  temp_handle_ = -1;
  std::fclose(file_);
  file_ = nullptr;
  // The rename is durable once the directory entry is; some file systems cannot fsync a directory (EINVAL),
  // which is not an error here.
  const std::string dir = directory_of(path_);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)fsync(dfd);
    ::close(dfd);
  }
  return Status();
}

void Writer::release_written() {
  if (!file_ || std::fflush(file_) != 0) return;
  const int fd = fileno(file_);
  // The window handed to writeback last time has (mostly) reached the disk by now: wait for the rest, then drop
  // it. Then start writeback of what was written since, without waiting.
  if (dropped_ < writeback_started_) {
    (void)sync_file_range(fd, off64_t(dropped_), off64_t(writeback_started_ - dropped_),
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    (void)posix_fadvise(fd, off_t(dropped_), off_t(writeback_started_ - dropped_), POSIX_FADV_DONTNEED);
    dropped_ = writeback_started_;
  }
  if (pos_ > writeback_started_) {
    (void)sync_file_range(fd, off64_t(writeback_started_), off64_t(pos_ - writeback_started_), SYNC_FILE_RANGE_WRITE);
    writeback_started_ = pos_;
  }
}

}  // namespace magnetar::gguf
