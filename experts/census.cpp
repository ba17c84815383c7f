#include "experts/census.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/temp_files.h"

namespace magnetar::experts {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'C', 'E', 'N', 'S', 'U', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4 + 4;

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(v));
  return v;
}

}  // namespace

uint64_t Census::total() const {
  uint64_t t = 0;
  for (uint64_t c : counts) t += c;
  return t;
}

uint64_t model_identity(const gguf::Model& model) {
  uint64_t h = fnv1a(nullptr, 0);
  const uint64_t bytes = model.file_bytes();
  h = fnv1a(reinterpret_cast<const uint8_t*>(&bytes), sizeof(bytes), h);
  for (const gguf::TensorInfo& t : model.tensors()) {
    h = fnv1a(reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size(), h);
    const uint64_t fields[4] = {t.type_id, t.offset, t.nbytes, t.shard};
    h = fnv1a(reinterpret_cast<const uint8_t*>(fields), sizeof(fields), h);
  }
  return h;
}

Result<Census> load_census(const std::string& path, uint64_t identity, int64_t n_layer, int64_t n_expert) {
  Census census{.n_layer = n_layer, .n_expert = n_expert, .counts = std::vector<uint64_t>(size_t(n_layer * n_expert))};
  const size_t want = kHeaderBytes + census.counts.size() * 8 + 8;
  // Read with the system calls: an error (a directory at the path, EIO) is a Status, where a stream threw.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return census;
    return Status::error(format("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  }
  std::string bytes(want + 1, '\0');  // one more than a valid file: a longer one is refused below
  size_t got = 0;
  struct stat st;
  int err = ::fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EISDIR;
  while (err == 0 && got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno;
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  if (err != 0) return Status::error(format("%s: cannot read: %s", path.c_str(), std::strerror(err)));
  bytes.resize(got);
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return Status::error(format("%s: not a census file", path.c_str()));
  }
  if (const uint32_t v = get<uint32_t>(bytes, 8); v != kVersion) {
    return Status::error(format("%s: census version %u, this build reads %u", path.c_str(), v, kVersion));
  }
  if (get<uint64_t>(bytes, 12) != identity) {
    return Status::error(format("%s: census of another model file", path.c_str()));
  }
  if (get<uint32_t>(bytes, 20) != uint32_t(n_layer) || get<uint32_t>(bytes, 24) != uint32_t(n_expert)) {
    return Status::error(format("%s: census of %u layers x %u experts, the model has %lld x %lld", path.c_str(),
                                get<uint32_t>(bytes, 20), get<uint32_t>(bytes, 24), (long long)n_layer,
                                (long long)n_expert));
  }
  if (bytes.size() != want) {
    return Status::error(format("%s: %zu bytes, expected %zu", path.c_str(), bytes.size(), want));
  }
  if (fnv1a(reinterpret_cast<const uint8_t*>(bytes.data()), want - 8) != get<uint64_t>(bytes, want - 8)) {
    return Status::error(format("%s: checksum mismatch (corrupted)", path.c_str()));
  }
  std::memcpy(census.counts.data(), bytes.data() + kHeaderBytes, census.counts.size() * 8);
  return census;
}

Status save_census(const std::string& path, uint64_t identity, const Census& census) {
  std::string out;
  out.append(kMagic, 8);
  put(out, kVersion);
  put(out, identity);
  put(out, uint32_t(census.n_layer));
  put(out, uint32_t(census.n_expert));
  out.append(reinterpret_cast<const char*>(census.counts.data()), census.counts.size() * 8);
  put(out, fnv1a(reinterpret_cast<const uint8_t*>(out.data()), out.size()));
  // The pid and a nonce name the temp file: two containers sharing the model's folder may both run as pid 1.
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(temp_files::nonce());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error(format("%s: cannot create: %s", tmp.c_str(), std::strerror(errno)));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::error(format("%s: write failed: %s", tmp.c_str(), std::strerror(err)));
    }
    done += size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::error(format("%s: cannot write: %s", path.c_str(), std::strerror(err)));
  }
  return Status();
}

}  // namespace magnetar::experts
