// The KV cache of one sequence: per layer, K and V rows for positions 0..n_ctx-1, each row
// [n_head_kv * head_dim] elements of F16 (default) or F32. Allocated once when a session is created.
#pragma once

#include <cstdint>
#include <vector>

#include "base/check.h"
#include "quant/quant.h"

namespace magnetar::kv {

class KvCache {
 public:
  KvCache(quant::Type type, int64_t n_layer, int64_t n_ctx, int64_t row_elements)
      : type_(type), n_ctx_(n_ctx), row_elements_(row_elements) {
    MAGNETAR_CHECK(type == quant::Type::F16 || type == quant::Type::F32);
    const size_t bytes = size_t(n_ctx) * size_t(row_elements) * (type == quant::Type::F16 ? 2 : 4);
    k_.resize(size_t(n_layer));
    v_.resize(size_t(n_layer));
    for (int64_t l = 0; l < n_layer; ++l) {
      k_[size_t(l)].resize(bytes);
      v_[size_t(l)].resize(bytes);
    }
  }

  quant::Type type() const { return type_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t row_elements() const { return row_elements_; }
  void* k(int64_t layer) { return k_[size_t(layer)].data(); }
  void* v(int64_t layer) { return v_[size_t(layer)].data(); }
  size_t bytes() const { return k_.empty() ? 0 : 2 * k_.size() * k_[0].size(); }

 private:
  quant::Type type_;
  int64_t n_ctx_;
  int64_t row_elements_;
  std::vector<std::vector<uint8_t>> k_, v_;  // [n_layer][n_ctx * row_elements] of type_
};

}  // namespace magnetar::kv
