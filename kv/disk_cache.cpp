#include "kv/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <unordered_set>

#include "base/check.h"
#include "base/sha256.h"
#include "base/temp_files.h"

namespace magnetar::kv {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 2;  // 2: chain keys by SHA-256 (1: the streaming hash below)
constexpr uint64_t kPage = 4096;  // header size and file alignment (O_DIRECT)

uint64_t pad_page(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

// A streaming 64-bit hash: four independent lanes over 32-byte groups (no serial dependency between them, so
// it runs near memory speed: a 2,048-token block of a large model is hundreds of MB), a buffered partial
// group, and the total length mixed in at the end. Any split of the same bytes into update() calls gives the
// same hash.
class Hasher {
 public:
  explicit Hasher(uint64_t seed) {
    for (int i = 0; i < 4; ++i) lane_[i] = seed ^ (0x2545F4914F6CDD1Dull * uint64_t(i + 1));
  }
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (held_ > 0) {
      const size_t take = std::min(n, size_t(32) - held_);
      std::memcpy(buf_ + held_, p, take);
      held_ += take;
      p += take;
      n -= take;
      if (held_ < 32) return;
      group(buf_);
      held_ = 0;
    }
    for (; n >= 32; p += 32, n -= 32) group(p);
    std::memcpy(buf_, p, n);
    held_ = n;
  }
  uint64_t finish() const {
    uint64_t h = total_ * kMul;
    for (int i = 0; i < 4; ++i) h = (h ^ lane_[i]) * kMul, h ^= h >> 31;
    for (size_t i = 0; i < held_; ++i) h = (h ^ buf_[i]) * kMul;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
  }

 private:
  static constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  void group(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      lane_[i] = (lane_[i] ^ w) * kMul;
      lane_[i] ^= lane_[i] >> 29;
    }
  }
  uint64_t lane_[4];
  uint8_t buf_[32] = {};
  size_t held_ = 0;
  uint64_t total_ = 0;
};

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  Hasher h(seed);
  h.update(data, n);
  return h.finish();
}

constexpr uint64_t kChunk = 64ull << 20;  // restore reads (O_DIRECT, double-buffered)
constexpr size_t kMaxDeclined = 4096;     // DiskCache::declined_'s entries

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

// Whether `name` is a block's temp file, ".<key: 16 hex digits>[.<pid>[.<nonce>]].tmp" (older builds wrote no pid or
// no nonce); its writer's pid, 0 when the name has none. Nothing else in the directory is ever removed.
bool temp_name(const std::string& name, long* pid) {
  if (name.size() < 21 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) return false;
  for (size_t i = 1; i < 17; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  *pid = 0;
  if (name[17] != '.') return false;
  if (name.size() == 21) return true;  // ".<key>.tmp"
  char* end = nullptr;
  *pid = std::strtol(name.c_str() + 18, &end, 10);
  if (*pid <= 0) return false;
  if (end == name.c_str() + name.size() - 4) return true;  // ".<key>.<pid>.tmp"
  if (*end != '.') return false;
  for (const char* c = end + 1; c != name.c_str() + name.size() - 4; ++c) {
    if (!std::isxdigit(static_cast<unsigned char>(*c))) return false;
  }
  return end + 1 != name.c_str() + name.size() - 4;  // ".<key>.<pid>.<nonce>.tmp"
}

// The directories of this process's open caches (canonical paths): a temp file with this process's pid is another
// open cache's save in progress when its directory is among them.
std::mutex g_open_mu;
std::vector<std::string> g_open_dirs;

// A temp file is an interrupted save once its writer is gone: its process has exited, the pid is this process's and
// no other cache of this process has the directory open (a crashed run of the same pid left it, as a container's pid
// 1 does), or the file is a day old (the pid may have been reused). Another live process sharing the directory may
// be writing it. Names without a pid (older builds) are always stale.
bool abandoned_temp(const std::string& path, long pid, bool dir_open_here) {
  if (pid <= 0) return true;
  if (pid == long(::getpid())) return !dir_open_here;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && now_seconds() - int64_t(st.st_mtime) > 24 * 3600) return true;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

DiskCache::DiskCache(const DiskCacheOptions& options, const KvFormat& format) : options_(options), format_(format) {
  row_bytes_ = uint64_t(quant::row_size(format.type, format.row_elements));
}

Result<std::unique_ptr<DiskCache>> DiskCache::open(const DiskCacheOptions& options, const KvFormat& kv_format) {
  if (options.dir.empty()) return Status::error("--kv-disk-dir: empty directory name");
  if (options.block_tokens < 1) return Status::error("disk KV: block tokens must be >= 1");
  if (!KvCache::supported(kv_format.type, kv_format.row_elements)) {
    return Status::error("disk KV: the KV type must be f16, f32, q8_0 or fp8");
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
  std::error_code ec;
  cache->canonical_dir_ = std::filesystem::weakly_canonical(options.dir, ec).string();
  bool dir_open_here = false;
  {
    std::lock_guard<std::mutex> lock(g_open_mu);
    dir_open_here = std::find(g_open_dirs.begin(), g_open_dirs.end(), cache->canonical_dir_) != g_open_dirs.end();
    g_open_dirs.push_back(cache->canonical_dir_);
  }
  MAGNETAR_RETURN_IF_ERROR(cache->scan(dir_open_here));
  std::lock_guard<std::mutex> lock(cache->mu_);
  cache->make_room(0, 0);
  return cache;
}

uint64_t DiskCache::block_file_bytes(const KvFormat& format, int64_t block_tokens) {
  const uint64_t row = uint64_t(quant::row_size(format.type, format.row_elements));
  return kPage + pad_page(uint64_t(block_tokens) * 4) +
         pad_page(uint64_t(format.n_layer) * 2 * uint64_t(block_tokens) * row);
}

uint64_t DiskCache::memory_bytes(const KvFormat& format, int64_t block_tokens) {
  const uint64_t block = uint64_t(format.n_layer) * 2 * uint64_t(block_tokens) *
                         uint64_t(quant::row_size(format.type, format.row_elements));
  return kMaxQueued * block + 2 * kChunk;
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
    Sha256 sha;
    sha.update(&key, sizeof(key));
    sha.update(tokens.data() + b * B, size_t(B) * 4);
    const std::array<uint8_t, 32> digest = sha.finish();
    std::memcpy(&key, digest.data(), sizeof(key));
    keys.push_back(key);
  }
  return keys;
}

void DiskCache::settle(std::unique_lock<std::mutex>& lock, std::span<const uint64_t> keys) const {
  changed_.wait(lock, [&] {
    for (const uint64_t k : in_flight_) {
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) return false;
    }
    return true;
  });
}

int64_t DiskCache::match(std::span<const int32_t> tokens, int64_t from_block) const {
  const std::vector<uint64_t> keys = chain(tokens);
  const size_t first = std::min(keys.size(), size_t(std::max<int64_t>(0, from_block)));
  std::unique_lock<std::mutex> lock(mu_);
  settle(lock, std::span<const uint64_t>(keys).subspan(first));
  size_t n = first;
  while (n < keys.size() && ours(keys[n])) ++n;
  return int64_t(n) * options_.block_tokens;
}

// ---- scan: index the directory at open ------------------------------------------------------------------

Status DiskCache::scan(bool dir_open_here) {
  DIR* d = ::opendir(options_.dir.c_str());
  if (!d) return Status::error(options_.dir + ": cannot list: " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : names) {
    const std::string path = options_.dir + "/" + name;
    if (long pid = 0; temp_name(name, &pid)) {
      if (abandoned_temp(path, pid, dir_open_here)) ::unlink(path.c_str());
      continue;
    }
    char* end = nullptr;
    const uint64_t name_key = name.size() == 20 ? std::strtoull(name.c_str(), &end, 16) : 0;
    if (end != name.c_str() + 16 || name.compare(16, 4, ".kvb") != 0) continue;
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    Header h{};
    struct stat st;
    const ssize_t got = f.fd >= 0 && ::fstat(f.fd, &st) == 0 ? ::pread(f.fd, &h, sizeof(h), 0) : -1;
    if (got < 0) {
      // The disk's trouble (EIO, no descriptor left), not the file's: kept and counted in the budget (by its size),
      // never loaded in this run; the blocks continuing it are not orphans.
      const int err = errno;
      const uint64_t size = ::stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
      std::fprintf(stderr, "magnetar: disk KV: %s: cannot read: %s (kept, not used)\n", path.c_str(),
                   std::strerror(err));
      entries_[name_key] = {.index = 0, .bytes = size, .mtime = now_seconds(), .foreign = true};
      continue;
    }
    if (got != ssize_t(sizeof(h))) std::memset(&h, 0, sizeof(h));  // shorter than a header: refused below
    const Entry foreign{.index = 0, .bytes = uint64_t(st.st_size), .mtime = int64_t(st.st_mtime), .foreign = true};
    if (std::memcmp(h.magic, kMagic, 8) == 0 && h.version != kVersion) {
      entries_[name_key] = foreign;  // another version's block (its header's layout is that version's)
      continue;
    }
    if (std::memcmp(h.magic, kMagic, 8) != 0 || h.header_hash != header_hash(h) || h.key != name_key) {
      std::fprintf(stderr, "magnetar: disk KV: %s: not a valid block file (bad header), deleted\n", path.c_str());
      ::unlink(path.c_str());
      stats_.blocks_rejected++;
      continue;
    }
    if (h.model_identity != format_.model_identity || h.kv_type != uint32_t(format_.type) ||
        h.n_layer != format_.n_layer || h.row_elements != format_.row_elements ||
        h.block_tokens != options_.block_tokens) {
      // Another model's or KV format's block: never loaded, but it takes room in the directory.
      entries_[name_key] = foreign;
      entries_[name_key].parent = h.parent;
      entries_[name_key].index = h.index;
      continue;
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
                              std::span<const uint8_t* const> pieces, bool locked) {
  const int64_t B = options_.block_tokens;
  const uint64_t total = block_file_bytes(), tokens_bytes = pad_page(uint64_t(B) * 4);
  const uint64_t rows = uint64_t(B) * row_bytes_;
  MAGNETAR_CHECK(pieces.size() == size_t(2 * format_.n_layer));

  const uint64_t nonce = temp_files::nonce();  // two writers of one pid apart (containers each run as pid 1)
  char tmp_name[80];
  std::snprintf(tmp_name, sizeof(tmp_name), "/.%016llx.%d.%016llx.tmp", (unsigned long long)key, int(::getpid()),
                (unsigned long long)nonce);
  const std::string tmp = options_.dir + tmp_name, final_path = path_of(key);
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (f.fd < 0) return Status::error(tmp + ": cannot create: " + std::strerror(errno));
  uint64_t at = kPage;  // the header goes last, once the payload's hash is known
  Hasher hash(key);
  auto put = [&](const void* data, uint64_t n) {
    hash.update(data, size_t(n));
    for (uint64_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(f.fd, static_cast<const uint8_t*>(data) + done, size_t(n - done), off_t(at + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += uint64_t(w);
    }
    at += n;
    return true;
  };
  const std::vector<uint8_t> zeros(kPage, 0);
  bool ok = put(ids.data(), uint64_t(B) * 4) && put(zeros.data(), tokens_bytes - uint64_t(B) * 4);
  for (size_t p = 0; ok && p < pieces.size(); ++p) ok = put(pieces[p], rows);
  if (ok && at < total) ok = put(zeros.data(), total - at);
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
  h.payload_bytes = total - kPage;
  h.payload_hash = hash.finish();
  h.header_hash = header_hash(h);
  std::vector<uint8_t> page(kPage, 0);
  std::memcpy(page.data(), &h, sizeof(h));
  ok = ok && ::pwrite(f.fd, page.data(), kPage, 0) == ssize_t(kPage);
  if (!ok || ::fsync(f.fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return Status::error(tmp + ": write failed: " + why);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::error(final_path + ": rename failed: " + std::strerror(errno));
  }
  Fd dir{::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (!locked) lock.lock();
  entries_[key] = {.parent = parent, .index = index, .bytes = total, .restores = 0, .mtime = now_seconds()};
  stats_.blocks_saved++;
  stats_.bytes_written += total;
  return Status();
}

Status DiskCache::save(std::span<const int32_t> tokens, int64_t n_valid, KvCache& kv) {
  MAGNETAR_CHECK(n_valid >= 0 && n_valid <= int64_t(tokens.size()) && n_valid <= kv.n_ctx());
  MAGNETAR_CHECK(kv.type() == format_.type && kv.row_elements() == format_.row_elements);
  const int64_t B = options_.block_tokens;
  const std::vector<uint64_t> keys = chain(tokens.first(size_t(n_valid / B * B)));
  kv.sync_host(n_valid / B * B);
  flush();  // a block queued by save_async is written once
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  bool wrote = false;
  std::vector<const uint8_t*> pieces(size_t(2 * format_.n_layer));
  for (size_t b = 0; b < keys.size(); ++b) {
    if (touch(keys[b])) continue;
    const uint64_t parent = b == 0 ? 0 : keys[b - 1];  // block 0's parent: 0
    if (!make_room(block_file_bytes(), parent)) {
      stats_.blocks_declined++;
      break;  // the blocks after it would be orphans
    }
    const uint64_t row0 = uint64_t(b) * uint64_t(B) * row_bytes_;
    for (int64_t l = 0; l < format_.n_layer; ++l) {
      pieces[size_t(2 * l)] = static_cast<const uint8_t*>(kv.k(l)) + row0;
      pieces[size_t(2 * l + 1)] = static_cast<const uint8_t*>(kv.v(l)) + row0;
    }
    MAGNETAR_RETURN_IF_ERROR(write_block(keys[b], parent, int64_t(b), tokens.subspan(b * size_t(B), size_t(B)), pieces,
                                         /*locked=*/true));
    wrote = true;
  }
  if (wrote) stats_.save_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status();
}

void DiskCache::save_async(std::span<const int32_t> tokens, int64_t n_valid, KvCache& kv) {
  MAGNETAR_CHECK(n_valid >= 0 && n_valid <= int64_t(tokens.size()) && n_valid <= kv.n_ctx());
  MAGNETAR_CHECK(kv.type() == format_.type && kv.row_elements() == format_.row_elements);
  const int64_t B = options_.block_tokens;
  const std::vector<uint64_t> keys = chain(tokens.first(size_t(n_valid / B * B)));
  const uint64_t rows = uint64_t(B) * row_bytes_;
  for (size_t b = 0; b < keys.size(); ++b) {
    {
      // Claim the block (so no other caller copies it too) once fewer than kMaxQueued blocks are held.
      std::unique_lock<std::mutex> lock(mu_);
      const auto claimed = [&] { return std::find(in_flight_.begin(), in_flight_.end(), keys[b]) != in_flight_.end(); };
      changed_.wait(lock, [&] { return in_flight_.size() < kMaxQueued || claimed(); });
      if (touch(keys[b]) || claimed()) continue;
      // The parent must be on disk, queued or being written, else the block would be an orphan (its parent's save
      // failed or was declined, or another thread still copies it and the child could reach the writer first); a
      // recently declined block would be declined again (see Budget).
      const auto parent_on_its_way = [&] {
        const uint64_t p = keys[b - 1];
        return p == writing_key_ || std::any_of(queue_.begin(), queue_.end(), [&](const Job& j) { return j.key == p; });
      };
      if (b > 0 && !entries_.count(keys[b - 1]) && !parent_on_its_way()) return;
      if (auto d = declined_.find(keys[b]); d != declined_.end()) {
        if (now_seconds() - d->second < kDeclineSeconds) return;
        declined_.erase(d);
      }
      in_flight_.push_back(keys[b]);
    }
    // The claim is given back if the copy cannot be allocated or the writer cannot start (flush() would wait for
    // the key forever).
    try {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
      }
      kv.sync_host(int64_t(b + 1) * B);
      const auto t0 = std::chrono::steady_clock::now();
      Job job{.key = keys[b],
              .parent = b == 0 ? 0 : keys[b - 1],
              .index = int64_t(b),
              .ids = std::vector<int32_t>(tokens.begin() + ptrdiff_t(b) * B, tokens.begin() + ptrdiff_t(b + 1) * B),
              .payload = std::make_unique<uint8_t[]>(size_t(2 * format_.n_layer) * rows)};
      const uint64_t row0 = uint64_t(b) * rows;
      for (int64_t l = 0; l < format_.n_layer; ++l) {
        std::memcpy(job.payload.get() + size_t(2 * l) * rows, static_cast<const uint8_t*>(kv.k(l)) + row0, rows);
        std::memcpy(job.payload.get() + size_t(2 * l + 1) * rows, static_cast<const uint8_t*>(kv.v(l)) + row0, rows);
      }
      std::lock_guard<std::mutex> lock(mu_);
      stats_.copy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      queue_.push_back(std::move(job));
      changed_.notify_all();
    } catch (const std::exception& e) {  // std::bad_alloc, std::system_error
      std::fprintf(stderr, "magnetar: disk KV: block %016llx not saved: %s\n", (unsigned long long)keys[b], e.what());
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), keys[b]));
      stats_.blocks_failed++;
      changed_.notify_all();
      return;
    }
  }
}

void DiskCache::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything written
    // Taken off the queue and named the block being written in one step: a caller finds its chain's blocks on disk,
    // queued or here, and make_room keeps this block's parent throughout.
    Job job = std::move(queue_.front());
    queue_.pop_front();
    writing_parent_ = job.parent;
    writing_key_ = job.key;
    changed_.notify_all();  // room in the queue
    const auto t0 = std::chrono::steady_clock::now();
    // A block whose parent's save failed or was declined after it was queued would be an orphan: dropped.
    const bool orphan = job.index > 0 && !entries_.count(job.parent);
    const bool room = !orphan && make_room(block_file_bytes(), job.parent);
    if (!room && !orphan) {
      stats_.blocks_declined++;
      if (declined_.size() >= kMaxDeclined) {  // bounded: the expired go, and when none has, nothing is recorded
        std::erase_if(declined_, [&](const auto& d) { return now_seconds() - d.second >= kDeclineSeconds; });
      }
      if (declined_.size() < kMaxDeclined) declined_[job.key] = now_seconds();
    }
    lock.unlock();
    std::vector<const uint8_t*> pieces(size_t(2 * format_.n_layer));
    const uint64_t rows = uint64_t(options_.block_tokens) * row_bytes_;
    for (size_t p = 0; p < pieces.size(); ++p) pieces[p] = job.payload.get() + p * rows;
    const Status st = room ? write_block(job.key, job.parent, job.index, job.ids, pieces, /*locked=*/false) : Status();
    if (!st.ok()) std::fprintf(stderr, "magnetar: disk KV: %s\n", st.message().c_str());
    lock.lock();
    writing_parent_ = 0;
    writing_key_ = 0;
    stats_.save_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) stats_.blocks_failed++;
    if (room && st.ok()) make_room(0, 0);  // a synchronous save() of another thread may have written meanwhile
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), job.key));
    changed_.notify_all();
  }
}

void DiskCache::flush() const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return in_flight_.empty(); });
}

DiskCache::~DiskCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    changed_.notify_all();
  }
  if (writer_.joinable()) writer_.join();
  std::lock_guard<std::mutex> lock(g_open_mu);
  if (auto it = std::find(g_open_dirs.begin(), g_open_dirs.end(), canonical_dir_); it != g_open_dirs.end()) {
    g_open_dirs.erase(it);
  }
}

// ---- restore --------------------------------------------------------------------------------------------

DiskCache::Read DiskCache::read_block(uint64_t key, uint64_t parent, int64_t index, std::span<const int32_t> ids,
                                      KvCache& kv) {
  const std::string path = path_of(key);
  const uint64_t total = block_file_bytes();
  const int64_t B = options_.block_tokens;
  const uint64_t tokens_bytes = pad_page(uint64_t(B) * 4);
  // Large O_DIRECT reads (files are whole pages) into two aligned chunk buffers: while one chunk is hashed and
  // scattered into the KV rows, the next is being read. Rows are written before the checksum is known: a block
  // that fails leaves its rows invalid, which restore() reports (they are recomputed).
  if (!read_buffer_) {
    read_buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(kPage, 2 * kChunk)));
    if (!read_buffer_) return Read::kIoError;
  }
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT)};
  if (f.fd < 0 && errno != ENOENT) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) {  // deleted by another process sharing the directory
      entries_.erase(key);
      return Read::kGone;
    }
    std::fprintf(stderr, "magnetar: disk KV: %s: cannot open: %s (kept)\n", path.c_str(), std::strerror(err));
    return Read::kIoError;
  }
  // A read that fails (EIO, ...) is the disk's trouble, not the file's: io_error is set and the file kept. A read
  // that ends early is a truncated file.
  std::atomic<int> io_error{0};
  auto read_at = [fd = f.fd, &io_error](uint8_t* dst, uint64_t offset, uint64_t n) {
    for (uint64_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd, dst + done, size_t(n - done), off_t(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) io_error = errno;
      if (r <= 0) return false;
      done += uint64_t(r);
    }
    return true;
  };
  uint8_t* bufs[2] = {read_buffer_.get(), read_buffer_.get() + kChunk};
  const uint64_t first = kPage + tokens_bytes;  // header + token ids, checked before any row is touched
  Header h{};
  bool ok = read_at(bufs[0], 0, first);
  Hasher hash(key);
  if (ok) {
    std::memcpy(&h, bufs[0], sizeof(h));
    ok = std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion && h.header_hash == header_hash(h) &&
         h.key == key && h.parent == parent && h.index == index && h.model_identity == format_.model_identity &&
         h.payload_bytes == total - kPage && std::memcmp(bufs[0] + kPage, ids.data(), size_t(B) * 4) == 0;
    hash.update(bufs[0] + kPage, tokens_bytes);
  }
  // The payload in file order maps to (layer, K|V, byte) of the block's rows.
  const uint64_t rows = uint64_t(B) * row_bytes_, row0 = uint64_t(index * B) * row_bytes_;
  const uint64_t payload = uint64_t(format_.n_layer) * 2 * rows;
  auto scatter = [&](const uint8_t* src, uint64_t pos, uint64_t n) {  // pos: offset in the payload
    while (n > 0 && pos < payload) {
      const uint64_t part = pos / rows, in_part = pos % rows, take = std::min(n, rows - in_part);
      const int64_t layer = int64_t(part / 2);
      uint8_t* dst = static_cast<uint8_t*>(part % 2 == 0 ? kv.k(layer) : kv.v(layer)) + row0 + in_part;
      std::memcpy(dst, src, size_t(std::min(take, payload - pos)));
      src += take;
      pos += take;
      n -= take;
    }
  };
  const uint64_t body = total - first;
  std::future<bool> next;
  bool direct_rows = rows % kPage == 0 && row0 % kPage == 0;
  for (int64_t l = 0; direct_rows && l < format_.n_layer; ++l) {
    direct_rows = reinterpret_cast<uintptr_t>(kv.k(l)) % kPage == 0 && reinterpret_cast<uintptr_t>(kv.v(l)) % kPage == 0;
  }
  if (ok && direct_rows) {
    // Zero copy: the payload's (layer, K|V) pieces are read straight into the rows, a group of pieces (up to one
    // chunk) per vectored read, and hashed there while the next group is read.
    const int64_t n_pieces = 2 * format_.n_layer;
    const int64_t per_group = std::max<int64_t>(1, int64_t(kChunk / rows));
    auto piece = [&](int64_t p) {
      return static_cast<uint8_t*>(p % 2 == 0 ? kv.k(p / 2) : kv.v(p / 2)) + row0;
    };
    auto read_group = [&, fd = f.fd](int64_t p0) {
      const int64_t p1 = std::min(n_pieces, p0 + per_group);
      std::vector<iovec> iov;
      for (int64_t p = p0; p < p1; ++p) iov.push_back({piece(p), size_t(rows)});
      const uint64_t want = uint64_t(p1 - p0) * rows;
      for (uint64_t done = 0; done < want;) {
        // Advance the iovecs past what a short read returned.
        size_t skip = size_t(done), i = 0;
        std::vector<iovec> rest;
        for (; i < iov.size(); ++i) {
          if (skip >= iov[i].iov_len) {
            skip -= iov[i].iov_len;
            continue;
          }
          rest.push_back({static_cast<uint8_t*>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
          skip = 0;
        }
        const ssize_t r = ::preadv(fd, rest.data(), int(rest.size()), off_t(first + uint64_t(p0) * rows + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) io_error = errno;
        if (r <= 0) return false;
        done += uint64_t(r);
      }
      return true;
    };
    next = std::async(std::launch::async, read_group, int64_t(0));
    for (int64_t p0 = 0; ok && p0 < n_pieces; p0 += per_group) {
      ok = next.get();
      if (ok && p0 + per_group < n_pieces) next = std::async(std::launch::async, read_group, p0 + per_group);
      for (int64_t p = p0; ok && p < std::min(n_pieces, p0 + per_group); ++p) hash.update(piece(p), size_t(rows));
    }
    if (ok && body > payload) {  // the file's zero padding after the payload
      ok = read_at(bufs[0], first + payload, body - payload);
      if (ok) hash.update(bufs[0], size_t(body - payload));
    }
  } else {
    auto launch = [&](int slot, uint64_t pos) {
      const uint64_t n = std::min(kChunk, body - pos);
      return std::async(std::launch::async, read_at, bufs[slot], first + pos, n);
    };
    if (ok && body > 0) next = launch(0, 0);
    for (uint64_t pos = 0, slot = 0; ok && pos < body; pos += kChunk, slot ^= 1) {
      ok = next.get();
      const uint64_t n = std::min(kChunk, body - pos);
      if (ok && pos + n < body) next = launch(int(slot ^ 1), pos + n);
      if (ok) {
        hash.update(bufs[slot], size_t(n));
        scatter(bufs[slot], pos, n);
      }
    }
  }
  if (next.valid()) next.wait();
  if (io_error != 0) {
    std::fprintf(stderr, "magnetar: disk KV: %s: read failed: %s (kept)\n", path.c_str(), std::strerror(io_error));
    return Read::kIoError;
  }
  ok = ok && h.payload_hash == hash.finish();
  if (!ok) {
    std::fprintf(stderr, "magnetar: disk KV: %s: truncated or corrupt (header, tokens or checksum), deleted\n",
                 path.c_str());
    remove_block(key);
    stats_.blocks_rejected++;
    return Read::kBad;
  }
  stats_.bytes_read += total;
  return Read::kOk;
}

int64_t DiskCache::restore(std::span<const int32_t> tokens, int64_t from_block, int64_t until_tokens, KvCache& kv) {
  MAGNETAR_CHECK(kv.type() == format_.type && kv.row_elements() == format_.row_elements);
  const int64_t B = options_.block_tokens;
  MAGNETAR_CHECK(from_block >= 0 && until_tokens % B == 0 && until_tokens <= int64_t(tokens.size()) &&
                 until_tokens <= kv.n_ctx());
  const std::vector<uint64_t> keys = chain(tokens.first(size_t(until_tokens)));
  const auto t0 = std::chrono::steady_clock::now();
  kv.sync_host(std::min(from_block * B, until_tokens));  // the rows before stay valid; the host copy must be too
  std::unique_lock<std::mutex> lock(mu_);
  settle(lock, std::span<const uint64_t>(keys).subspan(std::min(keys.size(), size_t(from_block))));
  int64_t b = from_block;
  for (; b < int64_t(keys.size()); ++b) {
    auto it = entries_.find(keys[size_t(b)]);
    if (it == entries_.end() || it->second.foreign) break;
    Read read = Read::kIoError;
    try {  // std::async may fail to start its thread (std::system_error)
      read = read_block(keys[size_t(b)], b == 0 ? 0 : keys[size_t(b) - 1], b, tokens.subspan(size_t(b * B), size_t(B)),
                        kv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "magnetar: disk KV: restore stopped: %s\n", e.what());
    }
    if (read != Read::kOk) break;
    it->second.restores++;
    it->second.mtime = now_seconds();
    ::utimensat(AT_FDCWD, path_of(it->first).c_str(), nullptr, 0);  // the age survives a restart
    stats_.blocks_restored++;
    stats_.tokens_restored += uint64_t(B);
  }
  stats_.restore_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kv.wrote_host(from_block * B, b * B);
  return b * B;
}

// ---- budget ---------------------------------------------------------------------------------------------

void DiskCache::remove_block(uint64_t key) {
  ::unlink(path_of(key).c_str());
  entries_.erase(key);
}

bool DiskCache::touch(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  const int64_t now = now_seconds();
  if (!it->second.foreign && now - it->second.mtime >= kMinAgeSeconds) {
    it->second.mtime = now;
    ::utimensat(AT_FDCWD, path_of(key).c_str(), nullptr, 0);  // the age survives a restart
  }
  return true;
}

bool DiskCache::make_room(uint64_t incoming, uint64_t parent) {
  uint64_t bytes = 0;
  std::unordered_map<uint64_t, int64_t> children;  // blocks on disk or on their way that continue each key
  for (const auto& [key, e] : entries_) {
    bytes += e.bytes;
    if (e.index > 0) children[e.parent]++;
  }
  for (const Job& job : queue_) children[job.parent]++;
  for (const uint64_t kept : {parent, writing_parent_}) {
    if (kept != 0) children[kept]++;
  }
  const int64_t now = now_seconds();
  const double fresh = 1.0;  // a new block's score: no restores, no age (the depth factor below aside)
  // The victims are chosen first and deleted only if together they make the room: a new block that is declined
  // after all deletes nothing.
  std::vector<uint64_t> victims;
  std::unordered_set<uint64_t> chosen;
  const auto gone = [&](uint64_t key) { return !entries_.count(key) || chosen.count(key); };
  while (bytes + incoming > options_.budget_bytes) {
    uint64_t victim = 0;
    double worst = 0;
    bool found = false;
    for (const auto& [key, e] : entries_) {
      if (chosen.count(key)) continue;
      const bool orphan = e.index > 0 && gone(e.parent);
      if (!orphan && children.count(key) && children[key] > 0) continue;  // its children need it
      const int64_t age = std::max<int64_t>(0, now - e.mtime);
      // Orphans first (unreachable); then the lowest score, and among equals the deepest block (its prefix is more
      // specific, so it is less likely to be shared).
      const double score =
          orphan ? -1.0 : double(1 + e.restores) / (1.0 + double(age) / 3600.0) / (1.0 + 1e-6 * double(e.index));
      if (incoming > 0 && !orphan && (score >= fresh || age < kMinAgeSeconds)) continue;  // worth keeping over it
      if (!found || score < worst) {
        victim = key;
        worst = score;
        found = true;
      }
    }
    if (!found) break;
    const Entry& e = entries_[victim];
    bytes -= e.bytes;
    if (e.index > 0 && children.count(e.parent)) children[e.parent]--;
    victims.push_back(victim);
    chosen.insert(victim);
  }
  const bool room = bytes + incoming <= options_.budget_bytes;
  if (!room && incoming > 0) return false;
  for (const uint64_t key : victims) remove_block(key);  // (incoming 0: as many as could go)
  stats_.blocks_evicted += victims.size();
  return room;
}

DiskCacheStats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskCacheStats s = stats_;
  for (const auto& [key, e] : entries_) {
    (e.foreign ? s.foreign_blocks : s.blocks_on_disk)++;
    (e.foreign ? s.foreign_bytes : s.bytes_on_disk) += e.bytes;
  }
  return s;
}

std::string DiskCache::describe() const {
  const DiskCacheStats s = stats();
  char line[512];
  std::snprintf(line, sizeof(line), "%s: %llu blocks of %lld tokens (%.2f of %.2f GiB, %.1f MiB per block)",
                options_.dir.c_str(), (unsigned long long)s.blocks_on_disk, (long long)options_.block_tokens,
                double(s.bytes_on_disk + s.foreign_bytes) / double(1ull << 30),
                double(options_.budget_bytes) / double(1ull << 30), double(block_file_bytes()) / double(1 << 20));
  std::string text = line;
  if (s.foreign_blocks > 0) {
    std::snprintf(line, sizeof(line), ", and %llu blocks (%.2f GiB) of other models or KV formats in the budget",
                  (unsigned long long)s.foreign_blocks, double(s.foreign_bytes) / double(1ull << 30));
    text += line;
  }
  return text;
}

}  // namespace magnetar::kv
