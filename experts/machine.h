// What the machine offers the process at start: RAM, the memory cgroup's limit, swap, and (on request) the
// read bandwidth of the disk holding the model. The memory planner (planner.h) turns a snapshot into budgets;
// keeping the snapshot a plain struct lets its tests feed synthetic machines.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace magnetar::experts {

// All sizes in bytes.
struct MachineSnapshot {
  uint64_t ram_total = 0;      // /proc/meminfo MemTotal
  uint64_t ram_available = 0;  // /proc/meminfo MemAvailable: the kernel's estimate of what can be allocated
                               // without swapping (free memory plus reclaimable page cache and slab)
  uint64_t swap_free = 0;      // /proc/meminfo SwapFree (reported, never planned with: see planner.h)
  // The memory cgroup level whose headroom (limit - usage + reclaimable) is smallest among the process's
  // cgroup and its ancestors; all three are nullopt when no level has a limit (or no cgroup was found).
  std::optional<uint64_t> cgroup_limit;        // memory.max (v2) / memory.limit_in_bytes (v1)
  std::optional<uint64_t> cgroup_usage;        // memory.current (v2) / memory.usage_in_bytes (v1)
  std::optional<uint64_t> cgroup_reclaimable;  // inactive_file of memory.stat (v2) / total_inactive_file (v1):
                                               // clean page cache the kernel reclaims before it OOM-kills
  std::string cgroup_dir;                      // the directory the limit was read from ("" when none)
};

// Reads /proc/meminfo, /proc/self/cgroup and the memory cgroup files (v2 unified hierarchy under
// /sys/fs/cgroup, or the v1 memory controller under /sys/fs/cgroup/memory), all below `root` ("" = the real
// system; tests pass a directory holding fake proc/ and sys/ trees).
// Errors name the file: a missing or malformed /proc/meminfo (MemTotal and MemAvailable are required), or a
// malformed cgroup file. A missing /proc/self/cgroup or missing cgroup files mean "no limit", not an error.
// When the process's cgroup directory is absent (a container that mounts only its own subtree at the mount
// point), the mount point itself is read. Limits >= kCgroupUnlimited (v1's "no limit" is 2^63 - 4096) and
// v2's "max" mean no limit.
Result<MachineSnapshot> read_machine(const std::string& root = "");

inline constexpr uint64_t kCgroupUnlimited = uint64_t(1) << 62;

// Sequential read bandwidth (bytes per second) of `bytes` of `path` from `offset`, read with O_DIRECT in
// 4 MiB requests at queue depth 1, so the page cache neither helps nor is polluted. Costs `bytes` of disk
// reads: the engine calls it only when asked (it is not part of every start). Fails when the file cannot be
// opened with O_DIRECT (tmpfs, some network file systems): the message says so and callers skip the figure.
// `offset` is rounded down and `bytes` up to 4 KiB; the read stops at end of file.
Result<double> measure_read_bandwidth(const std::string& path, uint64_t offset, uint64_t bytes);

}  // namespace magnetar::experts
