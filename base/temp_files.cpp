#include "base/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace magnetar::temp_files {
namespace {

constexpr int kEntries = 64;
constexpr size_t kPathMax = 4096;

struct Entry {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 listed
  char path[kPathMax];
};
Entry g_entries[kEntries];

void on_signal(int sig) {
  for (Entry& e : g_entries) {
    if (e.state.load(std::memory_order_acquire) == 2) ::unlink(e.path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void remove_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    // An ignored signal stays ignored (nohup, a background job of a script: SIGHUP / SIGINT ignored by the parent).
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

int add(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kEntries; ++i) {
    int free = 0;
    if (!g_entries[i].state.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(g_entries[i].path, path.c_str(), path.size() + 1);
    g_entries[i].state.store(2, std::memory_order_release);
    return i;
  }
  return -1;
}

uint64_t nonce() {
  static std::atomic<uint64_t> serial{0};
  uint64_t x = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) +
               serial.fetch_add(1) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finalizer
  return x ^ (x >> 29);
}

void forget(int handle) {
  if (handle < 0 || handle >= kEntries) return;
  g_entries[handle].state.store(0, std::memory_order_release);
}

}  // namespace magnetar::temp_files
