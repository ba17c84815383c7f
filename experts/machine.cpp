// Machine snapshot: /proc/meminfo, the memory cgroup (v2 or v1) and an optional O_DIRECT read probe.
#include "experts/machine.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>
#include <vector>

namespace magnetar::experts {
namespace {

namespace fs = std::filesystem;

// ---- small parsing helpers: every failure names the file -------------------------------------------------

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// A non-empty run of decimal digits that fits in 64 bits.
std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// /proc/meminfo: "Key:   <number> kB" lines (a few keys, e.g. HugePages_Total, carry no unit).
struct MemInfo {
  std::optional<uint64_t> total, available, swap_free;
};

Result<MemInfo> parse_meminfo(const std::string& text, const std::string& path) {
  MemInfo info;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string_view key = trim(std::string_view(line).substr(0, colon));
    std::optional<uint64_t>* slot = key == "MemTotal"       ? &info.total
                                    : key == "MemAvailable" ? &info.available
                                    : key == "SwapFree"     ? &info.swap_free
                                                            : nullptr;
    if (slot == nullptr) continue;
    std::string_view value = trim(std::string_view(line).substr(colon + 1));
    uint64_t scale = 1;
    if (value.size() > 2 && value.substr(value.size() - 2) == "kB") {
      scale = 1024;
      value = trim(value.substr(0, value.size() - 2));
    }
    const std::optional<uint64_t> n = parse_u64(value);
    if (!n || *n > UINT64_MAX / scale) {
      return Status::error(format("%s: %.*s: expected '<number> kB', got '%s'", path.c_str(), int(key.size()),
                                  key.data(), std::string(trim(std::string_view(line).substr(colon + 1))).c_str()));
    }
    *slot = *n * scale;
  }
  if (!info.total) return Status::error(path + ": no MemTotal line");
  if (!info.available) return Status::error(path + ": no MemAvailable line (Linux 3.14 or later is required)");
  return info;
}

// A cgroup limit file: a byte count, or "max" (v2) for no limit. nullopt = no limit; a missing file is no
// limit too (the root cgroup has none).
Result<std::optional<uint64_t>> read_limit(const std::string& path) {
  const std::optional<std::string> text = read_text(path);
  if (!text) return std::optional<uint64_t>();
  const std::string_view v = trim(*text);
  if (v == "max") return std::optional<uint64_t>();
  const std::optional<uint64_t> n = parse_u64(v);
  if (!n)
    return Status::error(format("%s: expected a byte count or 'max', got '%s'", path.c_str(), std::string(v).c_str()));
  if (*n >= kCgroupUnlimited) return std::optional<uint64_t>();
  return n;
}

Result<uint64_t> read_usage(const std::string& path) {
  const std::optional<std::string> text = read_text(path);
  if (!text) return Status::error(path + ": missing (the cgroup has a memory limit but no usage file)");
  const std::string_view v = trim(*text);
  const std::optional<uint64_t> n = parse_u64(v);
  if (!n) return Status::error(format("%s: expected a byte count, got '%s'", path.c_str(), std::string(v).c_str()));
  return *n;
}

// The value of `key` in a memory.stat file ("key value" lines); 0 when the file or the key is absent, since
// counting nothing as reclaimable only makes the plan more cautious.
Result<uint64_t> read_stat(const std::string& path, std::string_view key) {
  const std::optional<std::string> text = read_text(path);
  if (!text) return uint64_t(0);
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos || std::string_view(line).substr(0, space) != key) continue;
    const std::string_view v = trim(std::string_view(line).substr(space + 1));
    const std::optional<uint64_t> n = parse_u64(v);
    if (!n) {
      return Status::error(format("%s: %.*s: expected a byte count, got '%s'", path.c_str(), int(key.size()),
                                  key.data(), std::string(v).c_str()));
    }
    return *n;
  }
  return uint64_t(0);
}

// ---- the memory cgroup ----------------------------------------------------------------------------------
// Limits are hierarchical: an ancestor's limit binds the whole subtree, so every level from the process's
// cgroup up to the mount point is read and the one with the least headroom is kept.

struct CgroupFiles {
  std::string mount;  // root + "/sys/fs/cgroup" (v2) or root + "/sys/fs/cgroup/memory" (v1)
  std::string path;   // the process's cgroup, relative to the hierarchy's root ("/a/b")
  const char* limit;  // file names of this version
  const char* usage;
  const char* inactive_file_key;
};

// Finds the memory hierarchy in /proc/self/cgroup ("id:controllers:path" lines). A v1 line naming the memory
// controller wins over the v2 "0::" line (hybrid systems mount the memory controller on v1).
std::optional<CgroupFiles> find_cgroup(const std::string& root) {
  const std::optional<std::string> text = read_text(root + "/proc/self/cgroup");
  if (!text) return std::nullopt;
  std::optional<CgroupFiles> v2;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a);
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = std::string(trim(std::string_view(line).substr(b + 1)));
    if (id == "0" && controllers.empty()) {
      v2 = CgroupFiles{root + "/sys/fs/cgroup", path, "memory.max", "memory.current", "inactive_file"};
      continue;
    }
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name == "memory") {
        return CgroupFiles{root + "/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file"};
      }
    }
  }
  return v2;
}

Status read_cgroup(const std::string& root, MachineSnapshot& snap) {
  const std::optional<CgroupFiles> cg = find_cgroup(root);
  if (!cg) return Status();
  fs::path mount = fs::path(cg->mount).lexically_normal();
  if (!mount.has_filename()) mount = mount.parent_path();
  fs::path dir = (mount / fs::path(cg->path).relative_path()).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "/sys/fs/cgroup/" for the root cgroup "/"
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) dir = mount;
  std::optional<uint64_t> best_headroom;
  for (;;) {
    const std::string d = dir.string();
    MAGNETAR_ASSIGN_OR_RETURN(const std::optional<uint64_t> limit, read_limit(d + "/" + cg->limit));
    if (limit) {
      MAGNETAR_ASSIGN_OR_RETURN(const uint64_t usage, read_usage(d + "/" + cg->usage));
      MAGNETAR_ASSIGN_OR_RETURN(const uint64_t inactive, read_stat(d + "/memory.stat", cg->inactive_file_key));
      const uint64_t reclaimable = inactive < usage ? inactive : usage;
      const uint64_t used = usage - reclaimable;
      const uint64_t headroom = *limit > used ? *limit - used : 0;
      if (!best_headroom || headroom < *best_headroom) {
        best_headroom = headroom;
        snap.cgroup_limit = *limit;
        snap.cgroup_usage = usage;
        snap.cgroup_reclaimable = reclaimable;
        snap.cgroup_dir = d;
      }
    }
    if (dir == mount || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return Status();
}

}  // namespace

Result<MachineSnapshot> read_machine(const std::string& root) {
  const std::string meminfo_path = root + "/proc/meminfo";
  const std::optional<std::string> text = read_text(meminfo_path);
  if (!text) return Status::error(meminfo_path + ": cannot read: " + std::strerror(errno));
  MAGNETAR_ASSIGN_OR_RETURN(const MemInfo info, parse_meminfo(*text, meminfo_path));
  MachineSnapshot snap;
  snap.ram_total = *info.total;
  snap.ram_available = *info.available;
  snap.swap_free = info.swap_free.value_or(0);
  MAGNETAR_RETURN_IF_ERROR(read_cgroup(root, snap));
  return snap;
}

// ---- read bandwidth probe -------------------------------------------------------------------------------

Result<double> measure_read_bandwidth(const std::string& path, uint64_t offset, uint64_t bytes) {
  constexpr uint64_t kAlign = 4096;                 // logical block size O_DIRECT needs on NVMe and most SSDs
  constexpr uint64_t kRequest = uint64_t(4) << 20;  // large enough that per-request overhead is noise
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) return Status::error(path + ": O_DIRECT is not supported by this file system");
    return Status::error(path + ": cannot open: " + std::strerror(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> buffer(std::aligned_alloc(kAlign, kRequest));
  if (!buffer) return Status::error(path + ": cannot allocate the 4 MiB read buffer");

  uint64_t pos = offset / kAlign * kAlign;
  const uint64_t end = (offset + bytes + kAlign - 1) / kAlign * kAlign;
  uint64_t done = 0;
  const auto start = std::chrono::steady_clock::now();
  while (pos < end) {
    const size_t want = size_t(end - pos < kRequest ? end - pos : kRequest);
    const ssize_t got = ::pread(fd, buffer.get(), want, off_t(pos));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (err == EINVAL) return Status::error(path + ": O_DIRECT is not supported by this file system");
      return Status::error(
          format("%s: read at byte %llu: %s", path.c_str(), (unsigned long long)pos, std::strerror(err)));
    }
    if (got == 0) break;  // end of file
    done += uint64_t(got);
    pos += uint64_t(got);
    if (size_t(got) < want) break;  // a short O_DIRECT read means end of file
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (done == 0) {
    return Status::error(format("%s: nothing to read at byte %llu", path.c_str(), (unsigned long long)offset));
  }
  return double(done) / (seconds > 0 ? seconds : 1e-9);
}

}  // namespace magnetar::experts
