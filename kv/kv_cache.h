// The KV cache of one sequence: per layer, K and V rows for positions 0..n_ctx-1, each row
// [n_head_kv * head_dim] elements of F16 (default), F32, Q8_0 (ggml's blocks of 32: an f16 scale and 32 int8,
// 8.5 bits per element; row_elements a multiple of 32) or F8_E4M3 (a byte per element, quant/fp8.h). Allocated once
// when a session is created, each layer's K and V page-aligned (disk KV restores read straight into them with
// O_DIRECT).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "base/check.h"
#include "quant/quant.h"

namespace magnetar::kv {

class KvCache {
 public:
  KvCache(quant::Type type, int64_t n_layer, int64_t n_ctx, int64_t row_elements)
      : type_(type), n_ctx_(n_ctx), row_elements_(row_elements) {
    MAGNETAR_CHECK(supported(type, row_elements));
    row_bytes_ = quant::row_size(type, row_elements);
    layer_bytes_ = size_t(n_ctx) * row_bytes_;
    const size_t padded = (layer_bytes_ + kPage - 1) / kPage * kPage;
    for (int64_t l = 0; l < n_layer; ++l) {
      for (auto* side : {&k_, &v_}) {
        side->emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kPage, padded)));
        MAGNETAR_CHECK(side->back() != nullptr);
        std::memset(side->back().get(), 0, padded);
      }
    }
  }

  // ---- a device copy (the CUDA backend keeps the KV it computes on the GPU) -------------------------------
  // The host rows stay the cache's public face (disk checkpoints read and restore them); a backend that
  // computes elsewhere attaches a Mirror and the cache tracks which copy is current:
  //   rows [0, device_rows) of the mirror and [0, host_rows) of the host buffers are up to date.
  // Writers say what they wrote (wrote_host / wrote_device); readers of host rows call sync_host first.
  class Mirror {
   public:
    virtual ~Mirror() = default;
    // Copies rows [from, to) of every layer's K and V from the device into the host buffers of `cache`.
    virtual void download(KvCache& cache, int64_t from, int64_t to) = 0;
  };
  Mirror* mirror() { return mirror_.get(); }
  void set_mirror(std::unique_ptr<Mirror> mirror) {
    mirror_ = std::move(mirror);
    device_rows_ = 0;
  }
  int64_t device_rows() const { return device_rows_; }
  int64_t host_rows() const { return host_rows_; }
  // Rows [from, to) were written on the host (a disk restore) or on the device (a forward pass): the other
  // copy is stale from `from` on. A write that starts past the current prefix leaves the prefix as it was.
  void wrote_host(int64_t from, int64_t to) {
    if (host_rows_ >= from) host_rows_ = std::max(host_rows_, to);
    device_rows_ = std::min(device_rows_, from);
  }
  void wrote_device(int64_t from, int64_t to) {
    if (device_rows_ >= from) device_rows_ = std::max(device_rows_, to);
    host_rows_ = std::min(host_rows_, from);
  }
  // The mirror received host rows [device_rows(), to) (both copies now agree up to `to`).
  void copied_to_device(int64_t to) {
    MAGNETAR_CHECK(to <= host_rows_);
    device_rows_ = std::max(device_rows_, to);
  }
  // Makes host rows [0, rows) current (a no-op without a mirror: the host is then the only copy).
  void sync_host(int64_t rows) {
    if (mirror_ && host_rows_ < rows) {
      MAGNETAR_CHECK(rows <= device_rows_);
      mirror_->download(*this, host_rows_, rows);
      host_rows_ = rows;
    }
  }

  // The element types a cache can hold rows of row_elements in.
  static bool supported(quant::Type type, int64_t row_elements) {
    return type == quant::Type::F16 || type == quant::Type::F32 || type == quant::Type::F8_E4M3 ||
           (type == quant::Type::Q8_0 && row_elements % 32 == 0);
  }
  quant::Type type() const { return type_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t row_elements() const { return row_elements_; }
  size_t row_bytes() const { return row_bytes_; }  // one position's K (or V) of one layer
  void* k(int64_t layer) { return k_[size_t(layer)].get(); }
  void* v(int64_t layer) { return v_[size_t(layer)].get(); }
  size_t bytes() const { return 2 * k_.size() * layer_bytes_; }

 private:
  static constexpr size_t kPage = 4096;
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  quant::Type type_;
  int64_t n_ctx_;
  int64_t row_elements_;
  size_t row_bytes_ = 0;
  size_t layer_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t, Free>> k_, v_;  // [n_layer] -> [n_ctx * row_elements] of type_
  std::unique_ptr<Mirror> mirror_;
  int64_t host_rows_ = INT64_MAX;  // without a mirror every host row is current
  int64_t device_rows_ = 0;
};

}  // namespace magnetar::kv
