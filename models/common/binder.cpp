#include "models/common/binder.h"

#include <vector>

namespace magnetar::models {
namespace {

std::string shape_string(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  for (int64_t d : shape) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace

Tensor Binder::tensor(const std::string& name, std::initializer_list<int64_t> shape, Need need, Kind kind) {
  Tensor out;
  if (!status_.ok()) return out;
  const gguf::TensorInfo* info = file_.find_tensor(name);
  if (!info) {
    if (need == Need::kRequired) fail(format("tensor '%s' is missing (expected shape %s)", name.c_str(),
                                             shape_string(shape).c_str()));
    return out;
  }
  bool same = int(shape.size()) == info->n_dims;
  int d = 0;
  for (int64_t want : shape) same = same && info->ne[size_t(d++)] == want;
  if (!same) {
    fail(format("tensor '%s' has shape %s, expected %s", name.c_str(), info->shape_string().c_str(),
                shape_string(shape).c_str()));
    return out;
  }
  const quant::TypeTraits* traits = quant::find_traits(info->type_id);
  if (!traits || traits->vec_dot == nullptr) {
    fail(format("tensor '%s' has type %s, which Magnetar cannot compute with", name.c_str(),
                quant::type_label(info->type_id).c_str()));
    return out;
  }
  if (kind == Kind::kF32Only && traits->type != quant::Type::F32) {
    fail(format("tensor '%s' has type %s, expected F32", name.c_str(), quant::type_label(info->type_id).c_str()));
    return out;
  }
  out.data = info->data;
  out.type = traits->type;
  out.ne = info->ne;
  out.row_bytes = quant::row_size(traits->type, info->ne[0]);
  return out;
}

Tensor Binder::expert_part(const experts::ExpertLayout& layout, int64_t layer, experts::Part part,
                           std::initializer_list<int64_t> shape) {
  Tensor out;
  if (!status_.ok()) return out;
  if (layer >= layout.n_layer() || !layout.has_experts(layer)) {
    fail(format("layer %lld has a router but no packed experts", (long long)layer));
    return out;
  }
  const experts::PartDesc& desc = layout.part(layer, part);
  bool same = shape.size() == 3;
  int d = 0;
  for (int64_t want : shape) same = same && desc.ne[size_t(d++)] == want;
  if (!same) {
    fail(format("packed expert part '%s' has shape [%lld, %lld, %lld], expected %s", desc.name.c_str(),
                (long long)desc.ne[0], (long long)desc.ne[1], (long long)desc.ne[2], shape_string(shape).c_str()));
    return out;
  }
  if (!quant::computable(uint32_t(desc.type))) {  // a type id read from the file's pack metadata
    fail(format("packed expert part '%s' has type %s, which Magnetar cannot compute with", desc.name.c_str(),
                quant::type_label(uint32_t(desc.type)).c_str()));
    return out;
  }
  out.type = desc.type;
  out.ne = {desc.ne[0], desc.ne[1], desc.ne[2], 1};
  out.row_bytes = quant::row_size(desc.type, desc.ne[0]);
  return out;
}

int64_t Binder::integer(const std::string& key, Need need, int64_t fallback) {
  const gguf::Value* v = file_.find(key);
  if (!v) {
    if (need == Need::kRequired) fail(format("metadata '%s' is missing", key.c_str()));
    return fallback;
  }
  const std::optional<int64_t> i = v->as_int();
  if (!i) {
    fail(format("metadata '%s' must be an integer, got %s", key.c_str(), v->to_string().c_str()));
    return fallback;
  }
  return *i;
}

float Binder::real(const std::string& key, Need need, float fallback) {
  const gguf::Value* v = file_.find(key);
  if (!v) {
    if (need == Need::kRequired) fail(format("metadata '%s' is missing", key.c_str()));
    return fallback;
  }
  const std::optional<double> f = v->as_float();
  if (!f) {
    fail(format("metadata '%s' must be a number, got %s", key.c_str(), v->to_string().c_str()));
    return fallback;
  }
  return float(*f);
}

bool Binder::boolean(const std::string& key, bool fallback) {
  const gguf::Value* v = file_.find(key);
  if (!v) return fallback;
  if (v->type != gguf::ValueType::kBool) {
    fail(format("metadata '%s' must be a bool, got %s", key.c_str(), v->to_string().c_str()));
    return fallback;
  }
  return v->u != 0;
}

}  // namespace magnetar::models
