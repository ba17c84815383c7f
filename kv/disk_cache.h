// Disk KV checkpoints: the KV rows of a timeline saved as a chain of fixed-size token blocks, so a prompt that
// shares a prefix with anything computed before (on this run or an earlier one) restores that prefix from disk
// instead of prefilling it again.
//
// Keys: block i of a timeline is named by key_i = SHA-256(key_{i-1}, its token ids) cut to 64 bits, key_{-1} naming
// the model identity and KV format, so a key names the whole prefix up to the end of its block (a cryptographic hash:
// making another prefix's key equal to a given one, to have one's own KV restored into others' conversations,
// takes ~2^64 hashes). Two timelines that share a prefix share its blocks
// (stored once); a timeline rewritten in the middle still finds every block before the first changed one.
//
// Files (DIR/<key as 16 hex digits>.kvb, one per block), all sizes little-endian:
//   [header: 4 KiB] magic "MGKVBLK1", format version, model identity, KV type / layers / row elements, block
//                   tokens and index, key, parent key, payload bytes, payload checksum, header checksum
//   [token ids: block_tokens x int32, padded to 4 KiB]
//   [payload: per layer, the block's K rows then its V rows ([block_tokens, row_elements] of the KV type)]
// Written to DIR/.<key>.<pid>.<nonce>.tmp, fsynced, renamed, then the directory fsynced: a crash leaves either the
// whole file or a temp file (removed at the next open once its writer's process is gone, is this process, or it is a
// day old, so that processes sharing the directory keep each other's saves; no other name is ever removed). A file
// whose header, identity, tokens or checksum do not match is never loaded: a restore stops before it (warning; the
// file is deleted). A file that cannot be read (an I/O error, no descriptors left) ends the restore and is kept.
//
// Budget: the directory's block files all count, this model's and format's and foreign ones (of other models,
// KV formats or file versions, found at open). Before a block is written, room is made for it by deleting blocks
// that nothing continues: orphans first (a block whose parent is gone can never be reached again), then the leaf
// (a block no other block on disk or being saved continues) of lowest score = (1 + restores) / (1 + age in hours),
// the deepest among equals; a block with children is never deleted, since its children need it. Age counts from
// the last save, restore or save_async that found the block present. A victim must score below a new block (1) and
// be at least kMinAgeSeconds old; when no block qualifies, the new block is declined (counted) and its timeline is
// not offered again for kDeclineSeconds: a timeline longer than the budget keeps its first blocks instead of writing
// and deleting its tail at every block.
//
// Reads: O_DIRECT in 64 MiB chunks, double-buffered (the next chunk is read while the last is checked and copied
// into the KV rows). Writes: streamed from the KV rows (save) or from a copy of them (save_async: the copy is
// taken on the caller's thread, the file written by a background writer), hashed on the way.
//
// Thread-safety: every public method may be called from any thread; they serialize on one mutex, which the
// background writer does not hold while it writes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache.h"

namespace magnetar::kv {

struct DiskCacheOptions {
  std::string dir;                // created if missing
  uint64_t budget_bytes = 0;      // > 0
  int64_t block_tokens = 2048;    // tokens per block
};

// What a file must match to be loaded into a cache: the model and the KV layout.
struct KvFormat {
  uint64_t model_identity = 0;  // the engine's: gguf::Model::fingerprint (metadata, tensor directory, weights)
  quant::Type type = quant::Type::F16;
  int64_t n_layer = 0;
  int64_t row_elements = 0;
};

struct DiskCacheStats {
  uint64_t blocks_on_disk = 0, bytes_on_disk = 0;  // of this model and KV format
  uint64_t foreign_blocks = 0, foreign_bytes = 0;  // of other models, KV formats or file versions (see Budget)
  uint64_t blocks_saved = 0, blocks_restored = 0, blocks_evicted = 0, blocks_rejected = 0;
  uint64_t tokens_restored = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  double save_seconds = 0, restore_seconds = 0;
  uint64_t blocks_failed = 0;    // background saves that could not be written (each also a warning)
  uint64_t blocks_declined = 0;  // saves skipped: no room without deleting a block worth more (see Budget)
  double copy_seconds = 0;       // save_async: the caller's time copying rows out
};

class DiskCache {
 public:
  // Opens (creating) the directory and indexes the block files found there: temp files of interrupted saves are
  // removed, corrupt blocks deleted (a warning each), foreign ones indexed for the budget only.
  static Result<std::unique_ptr<DiskCache>> open(const DiskCacheOptions& options, const KvFormat& format);

  int64_t block_tokens() const { return options_.block_tokens; }
  // The keys of the full blocks of `tokens` (floor(size / block_tokens) of them).
  std::vector<uint64_t> chain(std::span<const int32_t> tokens) const;
  // How many leading tokens of `tokens` the disk holds by the index: the longest run of its chain's blocks that
  // are all present, in tokens (a multiple of block_tokens).
  // Blocks before `from_block` (the caller holds their rows) are taken as present, not looked up or waited for: a
  // prefill resumed in turns waited for its own block written in the turn before.
  int64_t match(std::span<const int32_t> tokens, int64_t from_block = 0) const;
  // Loads blocks [from_block, until_tokens / block_tokens) of `tokens` into rows of `kv`. Checks each file
  // (header, tokens, checksum) before its rows count; returns the tokens restored from the start of `tokens`
  // (until_tokens, or the start of the first block that failed: rows from there on are not valid).
  int64_t restore(std::span<const int32_t> tokens, int64_t from_block, int64_t until_tokens, KvCache& kv);
  // Saves the full blocks of tokens[0, n_valid) that are not on disk, reading their rows from `kv` (rows
  // 0..n_valid-1 must hold that timeline's KV), making room for each first (see Budget; a declined block ends the
  // call). A write error is returned (nothing partial is left under a block's name).
  Status save(std::span<const int32_t> tokens, int64_t n_valid, KvCache& kv);
  // The same without waiting for the disk: the rows of each new block are copied out of `kv` now (the caller may
  // overwrite them at once) and a background thread writes the files. At most kMaxQueued blocks are held (being
  // copied, queued or written); a call that would hold more waits for the writer first, so the copies never take
  // more than kMaxQueued blocks of memory. A failed write, or a copy that cannot be allocated (the call then
  // stops: memory is short), is a warning on stderr and counted (DiskCacheStats::blocks_failed).
  void save_async(std::span<const int32_t> tokens, int64_t n_valid, KvCache& kv);
  static constexpr size_t kMaxQueued = 2;
  // Waits until every queued block is on disk.
  void flush() const;
  ~DiskCache();  // flushes, then stops the writer
  DiskCacheStats stats() const;
  // "DIR: 12 blocks of 2,048 tokens (1.50 GiB of 8.00 GiB)"
  std::string describe() const;

  // One block's file size (header + tokens + payload), for budgets.
  uint64_t block_file_bytes() const { return block_file_bytes(format_, options_.block_tokens); }
  static uint64_t block_file_bytes(const KvFormat& format, int64_t block_tokens);
  static constexpr int64_t kMinAgeSeconds = 60, kDeclineSeconds = 600;
  // The most memory a cache of this format and block size allocates besides the KV rows it reads and writes: the
  // background writer's kMaxQueued block copies and the restore's read buffers (the memory planner counts it).
  static uint64_t memory_bytes(const KvFormat& format, int64_t block_tokens);

 private:
  struct Entry {
    uint64_t parent = 0;
    int64_t index = 0;
    uint64_t bytes = 0;
    uint64_t restores = 0;
    int64_t mtime = 0;     // seconds since the epoch (save, restore, or a save that found it present)
    bool foreign = false;  // another model's, KV format's or file version's block: never loaded
  };
  // With mu_ held through `lock`: waits until none of `keys` is being copied, queued or written (match and restore:
  // a block of their chain counts once written; another timeline's writes are not waited for).
  void settle(std::unique_lock<std::mutex>& lock, std::span<const uint64_t> keys) const;
  bool ours(uint64_t key) const {
    auto it = entries_.find(key);
    return it != entries_.end() && !it->second.foreign;
  }
  DiskCache(const DiskCacheOptions& options, const KvFormat& format);
  Status scan(bool dir_open_here);  // dir_open_here: another cache of this process has the directory open
  std::string path_of(uint64_t key) const;
  // Writes one block's file from its 2 * n_layer payload pieces (K then V rows of each layer, block_tokens rows
  // each) and, with mu_ held by the caller or taken here (`locked`), records it in the index.
  Status write_block(uint64_t key, uint64_t parent, int64_t index, std::span<const int32_t> ids,
                     std::span<const uint8_t* const> pieces, bool locked);
  void writer_loop();
  // kBad: the file failed its checks (deleted); kGone: another process deleted it; kIoError: it could not be read
  // (kept). Rows of the block are invalid unless kOk.
  enum class Read { kOk, kBad, kGone, kIoError };
  Read read_block(uint64_t key, uint64_t parent, int64_t index, std::span<const int32_t> ids, KvCache& kv);
  // With mu_ held: deletes blocks (see Budget) until `incoming` more bytes fit the budget; `parent` (0: none) is the
  // incoming block's, kept. incoming 0 (open, or after a concurrent write) deletes whatever leaves it takes, without
  // the score and age conditions. False when no block may go: the incoming block is declined.
  bool make_room(uint64_t incoming, uint64_t parent);
  // With mu_ held: whether `key` is on disk; if so its age starts again (see Budget).
  bool touch(uint64_t key);
  void remove_block(uint64_t key);

  DiskCacheOptions options_;
  std::string canonical_dir_;  // the directory's canonical path (the process's open directories)
  KvFormat format_;
  uint64_t row_bytes_ = 0;  // one token's K (or V) row of one layer
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;  // guarded by mu_
  DiskCacheStats stats_;                         // guarded by mu_
  struct AlignedFree {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, AlignedFree> read_buffer_;  // restore's two 64 MiB chunks, guarded by mu_

  // save_async's queue (guarded by mu_): blocks copied out and waiting for the writer, and the one it writes.
  struct Job {
    uint64_t key = 0, parent = 0;
    int64_t index = 0;
    std::vector<int32_t> ids;
    std::unique_ptr<uint8_t[]> payload;  // [n_layer][K, V][block rows]
  };
  std::deque<Job> queue_;
  std::vector<uint64_t> in_flight_;        // keys being copied, queued or written
  uint64_t writing_parent_ = 0;            // the parent of the block the writer is writing (kept by make_room)
  uint64_t writing_key_ = 0;               // ... and its key
  std::unordered_map<uint64_t, int64_t> declined_;  // key -> when its save was declined (see Budget)
  mutable std::condition_variable changed_;  // queue_ / in_flight_ changed, or stopping_
  bool stopping_ = false;
  std::thread writer_;                     // started by the first save_async
};

}  // namespace magnetar::kv
