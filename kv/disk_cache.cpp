#include "kv/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/check.h"

namespace magnetar::kv {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kPage = 4096;  // header size and file alignment (O_DIRECT)

uint64_t pad_page(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

// 64-bit hash of bytes, 8 at a time (several GB/s: a 2,048-token block of a large model is hundreds of MB).
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed ^ (uint64_t(n) * kMul);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  h = (h ^ tail ^ (uint64_t(n - i) << 56)) * kMul;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t kv_type;
  uint64_t model_identity;
  int64_t n_layer;
  int64_t row_elements;
  int64_t block_tokens;
  int64_t index;        // block index in its timeline
  uint64_t key;
  uint64_t parent;      // key of the previous block (the format's root key for block 0)
  uint64_t payload_bytes;
  uint64_t payload_hash;  // over the token ids and the payload
  uint64_t header_hash;   // over the fields above
};
static_assert(sizeof(Header) <= kPage);

uint64_t header_hash(const Header& h) { return hash_bytes(&h, offsetof(Header, header_hash), 0x4D474B56); }

int64_t now_seconds() { return int64_t(std::time(nullptr)); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

DiskCache::DiskCache(const DiskCacheOptions& options, const KvFormat& format) : options_(options), format_(format) {
  row_bytes_ = uint64_t(format.row_elements) * (format.type == quant::Type::F16 ? 2 : 4);
}

Result<std::unique_ptr<DiskCache>> DiskCache::open(const DiskCacheOptions& options, const KvFormat& kv_format) {
  if (options.dir.empty()) return Status::error("--kv-disk-dir: empty directory name");
  if (options.block_tokens < 1) return Status::error("disk KV: block tokens must be >= 1");
  if (kv_format.type != quant::Type::F16 && kv_format.type != quant::Type::F32) {
    return Status::error("disk KV: the KV type must be f16 or f32");
  }
  if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::error(options.dir + ": cannot create the directory: " + std::strerror(errno));
  }
  struct stat st;
  if (::stat(options.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::error(options.dir + ": not a directory");
  }
  std::unique_ptr<DiskCache> cache(new DiskCache(options, kv_format));
  if (options.budget_bytes < cache->block_file_bytes()) {
    return Status::error(format("--kv-disk-gb %.3f holds no block: one block of %lld tokens takes %.3f GiB",
                                double(options.budget_bytes) / double(1ull << 30), (long long)options.block_tokens,
                                double(cache->block_file_bytes()) / double(1ull << 30)));
  }
  MAGNETAR_RETURN_IF_ERROR(cache->scan());
  std::lock_guard<std::mutex> lock(cache->mu_);
  cache->enforce_budget();
  return cache;
}

uint64_t DiskCache::block_file_bytes() const {
  return kPage + pad_page(uint64_t(options_.block_tokens) * 4) +
         pad_page(uint64_t(format_.n_layer) * 2 * uint64_t(options_.block_tokens) * row_bytes_);
}

std::string DiskCache::path_of(uint64_t key) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/%016llx.kvb", (unsigned long long)key);
  return options_.dir + name;
}

std::vector<uint64_t> DiskCache::chain(std::span<const int32_t> tokens) const {
  const int64_t B = options_.block_tokens;
  const uint64_t fields[5] = {format_.model_identity, uint64_t(format_.type), uint64_t(format_.n_layer),
                              uint64_t(format_.row_elements), uint64_t(B)};
  uint64_t key = hash_bytes(fields, sizeof(fields), kVersion);  // the root: names the model and the KV format
  std::vector<uint64_t> keys;
  for (int64_t b = 0; (b + 1) * B <= int64_t(tokens.size()); ++b) {
    key = hash_bytes(tokens.data() + b * B, size_t(B) * 4, key);
    keys.push_back(key);
  }
  return keys;
}

int64_t DiskCache::match(std::span<const int32_t> tokens) const {
  const std::vector<uint64_t> keys = chain(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  while (n < keys.size() && entries_.count(keys[n])) ++n;
  return int64_t(n) * options_.block_tokens;
}

// ---- scan: index the directory at open ------------------------------------------------------------------

Status DiskCache::scan() {
  DIR* d = ::opendir(options_.dir.c_str());
  if (!d) return Status::error(options_.dir + ": cannot list: " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : names) {
    const std::string path = options_.dir + "/" + name;
    if (name.size() > 4 && name[0] == '.' && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      ::unlink(path.c_str());  // an interrupted save
      continue;
    }
    if (name.size() != 20 || name.compare(16, 4, ".kvb") != 0) continue;
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    Header h{};
    struct stat st;
    if (f.fd < 0 || ::pread(f.fd, &h, sizeof(h), 0) != ssize_t(sizeof(h)) || ::fstat(f.fd, &st) != 0) {
      std::fprintf(stderr, "magnetar: disk KV: %s: unreadable, skipped\n", path.c_str());
      continue;
    }
    if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion || h.header_hash != header_hash(h)) {
      std::fprintf(stderr, "magnetar: disk KV: %s: not a valid block file (bad header), deleted\n", path.c_str());
      ::unlink(path.c_str());
      stats_.blocks_rejected++;
      continue;
    }
    if (h.model_identity != format_.model_identity || h.kv_type != uint32_t(format_.type) ||
        h.n_layer != format_.n_layer || h.row_elements != format_.row_elements ||
        h.block_tokens != options_.block_tokens) {
      continue;  // another model's or another format's block: not ours to load or to evict
    }
    if (uint64_t(st.st_size) != block_file_bytes()) {
      std::fprintf(stderr, "magnetar: disk KV: %s: %lld bytes, expected %llu, deleted\n", path.c_str(),
                   (long long)st.st_size, (unsigned long long)block_file_bytes());
      ::unlink(path.c_str());
      stats_.blocks_rejected++;
      continue;
    }
    entries_[h.key] = {.parent = h.parent, .index = h.index, .bytes = uint64_t(st.st_size), .restores = 0,
                       .mtime = int64_t(st.st_mtime)};
  }
  return Status();
}

// ---- save -----------------------------------------------------------------------------------------------

Status DiskCache::write_block(uint64_t key, uint64_t parent, int64_t index, std::span<const int32_t> ids,
                              const KvCache& kv) {
  const int64_t B = options_.block_tokens;
  const uint64_t total = block_file_bytes(), tokens_at = kPage, payload_at = kPage + pad_page(uint64_t(B) * 4);
  buffer_.assign(total, 0);
  std::memcpy(buffer_.data() + tokens_at, ids.data(), size_t(B) * 4);
  uint8_t* out = buffer_.data() + payload_at;
  const uint64_t rows = uint64_t(B) * row_bytes_;
  for (int64_t l = 0; l < format_.n_layer; ++l) {
    auto& cache = const_cast<KvCache&>(kv);  // k()/v() are non-const accessors; nothing is written
    std::memcpy(out, static_cast<const uint8_t*>(cache.k(l)) + uint64_t(index * B) * row_bytes_, rows);
    out += rows;
    std::memcpy(out, static_cast<const uint8_t*>(cache.v(l)) + uint64_t(index * B) * row_bytes_, rows);
    out += rows;
  }
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.kv_type = uint32_t(format_.type);
  h.model_identity = format_.model_identity;
  h.n_layer = format_.n_layer;
  h.row_elements = format_.row_elements;
  h.block_tokens = B;
  h.index = index;
  h.key = key;
  h.parent = parent;
  h.payload_bytes = total - tokens_at;
  h.payload_hash = hash_bytes(buffer_.data() + tokens_at, total - tokens_at, key);
  h.header_hash = header_hash(h);
  std::memcpy(buffer_.data(), &h, sizeof(h));

  char tmp_name[40];
  std::snprintf(tmp_name, sizeof(tmp_name), "/.%016llx.tmp", (unsigned long long)key);
  const std::string tmp = options_.dir + tmp_name, final_path = path_of(key);
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (f.fd < 0) return Status::error(tmp + ": cannot create: " + std::strerror(errno));
    for (uint64_t done = 0; done < total;) {
      const ssize_t n = ::pwrite(f.fd, buffer_.data() + done, size_t(total - done), off_t(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "no progress";
        ::unlink(tmp.c_str());
        return Status::error(tmp + ": write failed: " + why);
      }
      done += uint64_t(n);
    }
    if (::fsync(f.fd) != 0) {
      ::unlink(tmp.c_str());
      return Status::error(tmp + ": fsync failed: " + std::strerror(errno));
    }
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::error(final_path + ": rename failed: " + std::strerror(errno));
  }
  Fd dir{::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);
  entries_[key] = {.parent = parent, .index = index, .bytes = total, .restores = 0, .mtime = now_seconds()};
  stats_.blocks_saved++;
  stats_.bytes_written += total;
  return Status();
}

Status DiskCache::save(std::span<const int32_t> tokens, int64_t n_valid, const KvCache& kv) {
  MAGNETAR_CHECK(n_valid >= 0 && n_valid <= int64_t(tokens.size()) && n_valid <= kv.n_ctx());
  MAGNETAR_CHECK(kv.type() == format_.type && kv.row_elements() == format_.row_elements);
  const int64_t B = options_.block_tokens;
  const std::vector<uint64_t> keys = chain(tokens.first(size_t(n_valid / B * B)));
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  bool wrote = false;
  for (size_t b = 0; b < keys.size(); ++b) {
    if (entries_.count(keys[b])) continue;
    const uint64_t parent = b == 0 ? 0 : keys[b - 1];  // block 0's parent: 0
    MAGNETAR_RETURN_IF_ERROR(write_block(keys[b], parent, int64_t(b), tokens.subspan(b * size_t(B), size_t(B)), kv));
    wrote = true;
  }
  if (wrote) {
    stats_.save_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    enforce_budget();
  }
  return Status();
}

// ---- restore --------------------------------------------------------------------------------------------

bool DiskCache::read_block(uint64_t key, uint64_t parent, int64_t index, std::span<const int32_t> ids, KvCache& kv) {
  const std::string path = path_of(key);
  const uint64_t total = block_file_bytes();
  const int64_t B = options_.block_tokens;
  // O_DIRECT into an aligned buffer (files are whole pages): large sequential reads that bypass the page cache.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT)};
  if (f.fd < 0) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::unique_ptr<uint8_t, AlignedFree> buf(static_cast<uint8_t*>(std::aligned_alloc(kPage, total)));
  bool ok = f.fd >= 0 && buf;
  for (uint64_t done = 0; ok && done < total;) {
    const ssize_t n = ::pread(f.fd, buf.get() + done, size_t(std::min<uint64_t>(total - done, 64ull << 20)), off_t(done));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    done += ok ? uint64_t(n) : 0;
  }
  Header h{};
  if (ok) {
    std::memcpy(&h, buf.get(), sizeof(h));
    ok = std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion && h.header_hash == header_hash(h) &&
         h.key == key && h.parent == parent && h.index == index && h.model_identity == format_.model_identity &&
         h.payload_bytes == total - kPage &&
         std::memcmp(buf.get() + kPage, ids.data(), size_t(B) * 4) == 0 &&
         h.payload_hash == hash_bytes(buf.get() + kPage, total - kPage, key);
  }
  if (!ok) {
    std::fprintf(stderr, "magnetar: disk KV: %s: unreadable or corrupt (header, tokens or checksum), deleted\n",
                 path.c_str());
    remove_block(key);
    stats_.blocks_rejected++;
    return false;
  }
  const uint8_t* in = buf.get() + kPage + pad_page(uint64_t(B) * 4);
  const uint64_t rows = uint64_t(B) * row_bytes_;
  for (int64_t l = 0; l < format_.n_layer; ++l) {
    std::memcpy(static_cast<uint8_t*>(kv.k(l)) + uint64_t(index * B) * row_bytes_, in, rows);
    in += rows;
    std::memcpy(static_cast<uint8_t*>(kv.v(l)) + uint64_t(index * B) * row_bytes_, in, rows);
    in += rows;
  }
  stats_.bytes_read += total;
  return true;
}

int64_t DiskCache::restore(std::span<const int32_t> tokens, int64_t from_block, int64_t until_tokens, KvCache& kv) {
  MAGNETAR_CHECK(kv.type() == format_.type && kv.row_elements() == format_.row_elements);
  const int64_t B = options_.block_tokens;
  MAGNETAR_CHECK(from_block >= 0 && until_tokens % B == 0 && until_tokens <= int64_t(tokens.size()) &&
                 until_tokens <= kv.n_ctx());
  const std::vector<uint64_t> keys = chain(tokens.first(size_t(until_tokens)));
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  int64_t b = from_block;
  for (; b < int64_t(keys.size()); ++b) {
    auto it = entries_.find(keys[size_t(b)]);
    if (it == entries_.end()) break;
    if (!read_block(keys[size_t(b)], b == 0 ? 0 : keys[size_t(b) - 1], b, tokens.subspan(size_t(b * B), size_t(B)), kv)) {
      break;
    }
    it->second.restores++;
    it->second.mtime = now_seconds();
    ::utimensat(AT_FDCWD, path_of(it->first).c_str(), nullptr, 0);  // the age survives a restart
    stats_.blocks_restored++;
    stats_.tokens_restored += uint64_t(B);
  }
  stats_.restore_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b * B;
}

// ---- budget ---------------------------------------------------------------------------------------------

void DiskCache::remove_block(uint64_t key) {
  ::unlink(path_of(key).c_str());
  entries_.erase(key);
}

void DiskCache::enforce_budget() {
  uint64_t bytes = 0;
  for (const auto& [key, e] : entries_) bytes += e.bytes;
  const int64_t now = now_seconds();
  while (bytes > options_.budget_bytes && !entries_.empty()) {
    uint64_t victim = 0;
    double worst = 0;
    bool found = false;
    for (const auto& [key, e] : entries_) {
      const bool orphan = e.index > 0 && !entries_.count(e.parent);
      const double age_hours = double(std::max<int64_t>(0, now - e.mtime)) / 3600.0;
      // Orphans first (unreachable); then the lowest score, and among equals the deepest block (its prefix
      // is more specific, so it is less likely to be shared).
      const double score = orphan ? -1.0 : double(1 + e.restores) / (1.0 + age_hours) / (1.0 + 1e-6 * double(e.index));
      if (!found || score < worst) {
        victim = key;
        worst = score;
        found = true;
      }
    }
    bytes -= entries_[victim].bytes;
    remove_block(victim);
    stats_.blocks_evicted++;
  }
}

DiskCacheStats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskCacheStats s = stats_;
  s.blocks_on_disk = entries_.size();
  s.bytes_on_disk = 0;
  for (const auto& [key, e] : entries_) s.bytes_on_disk += e.bytes;
  return s;
}

std::string DiskCache::describe() const {
  const DiskCacheStats s = stats();
  char line[512];
  std::snprintf(line, sizeof(line), "%s: %llu blocks of %lld tokens (%.2f of %.2f GiB, %.1f MiB per block)",
                options_.dir.c_str(), (unsigned long long)s.blocks_on_disk, (long long)options_.block_tokens,
                double(s.bytes_on_disk) / double(1ull << 30), double(options_.budget_bytes) / double(1ull << 30),
                double(block_file_bytes()) / double(1 << 20));
  return line;
}

}  // namespace magnetar::kv
