// The KV cache of one sequence: per layer, K and V rows for positions 0..n_ctx-1, each row
// [n_head_kv * head_dim] elements of F16 (default) or F32. Allocated once when a session is created, each
// layer's K and V page-aligned (disk KV restores read straight into them with O_DIRECT).
#pragma once

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
    MAGNETAR_CHECK(type == quant::Type::F16 || type == quant::Type::F32);
    layer_bytes_ = size_t(n_ctx) * size_t(row_elements) * (type == quant::Type::F16 ? 2 : 4);
    const size_t padded = (layer_bytes_ + kPage - 1) / kPage * kPage;
    for (int64_t l = 0; l < n_layer; ++l) {
      for (auto* side : {&k_, &v_}) {
        side->emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kPage, padded)));
        MAGNETAR_CHECK(side->back() != nullptr);
        std::memset(side->back().get(), 0, padded);
      }
    }
  }

  quant::Type type() const { return type_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t row_elements() const { return row_elements_; }
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
  size_t layer_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t, Free>> k_, v_;  // [n_layer] -> [n_ctx * row_elements] of type_
};

}  // namespace magnetar::kv
