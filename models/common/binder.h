// Binding GGUF tensors and metadata to typed structs at load time (STYLE.md rule 3). Every mismatch fails
// the load naming the tensor or key, the expected and the actual type and shape; after load nothing is
// looked up by string.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "base/status.h"
#include "experts/layout.h"
#include "gguf/reader.h"
#include "quant/quant.h"

namespace magnetar::models {

// A bound weight: zero-copy view into the mapped file.
struct Tensor {
  const uint8_t* data = nullptr;
  quant::Type type = quant::Type::F32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ggml order
  size_t row_bytes = 0;                    // bytes of one ne[0] row

  bool present() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  // Rows [row * row_bytes ...): e.g. expert e of a [n_in, n_out, n_expert] tensor starts at row e * n_out.
  const uint8_t* row(int64_t r) const { return data + size_t(r) * row_bytes; }
};

enum class Need { kRequired, kOptional };
enum class Kind { kAnyType, kF32Only };  // norms and routers must be F32

// Collects the first error; bind() after an error returns an empty Tensor.
class Binder {
 public:
  explicit Binder(const gguf::Model& file) : file_(file) {}

  Tensor tensor(const std::string& name, std::initializer_list<int64_t> shape, Need need = Need::kRequired,
                Kind kind = Kind::kAnyType);
  // A routed-expert part of a packed file (experts/layout.h): type and shape checked like tensor(), data
  // null (the bytes come from an ExpertSource).
  Tensor expert_part(const experts::ExpertLayout& layout, int64_t layer, experts::Part part,
                     std::initializer_list<int64_t> shape);
  // Metadata: integers of any width, floats, bools. Missing required key -> error; optional -> fallback.
  int64_t integer(const std::string& key, Need need = Need::kRequired, int64_t fallback = 0);
  float real(const std::string& key, Need need = Need::kRequired, float fallback = 0.0f);
  bool boolean(const std::string& key, bool fallback);
  bool has(const std::string& key) const { return file_.find(key) != nullptr; }
  bool has_tensor(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

  const Status& status() const { return status_; }
  void fail(const std::string& message) {
    if (status_.ok()) status_ = Status::error(file_.shards()[0]->path() + ": " + message);
  }

 private:
  const gguf::Model& file_;
  Status status_;
};

}  // namespace magnetar::models
