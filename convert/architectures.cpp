#include "convert/architectures.h"

#include <algorithm>
#include <optional>
#include <unordered_set>

namespace magnetar::convert {
namespace {

using gguf::KeyValue;
using gguf::Value;
using gguf::ValueType;

// ---- metadata -------------------------------------------------------------------------------------------
// Appends "<arch>.<key>" entries with the GGUF value types llama.cpp's gguf-py writer uses for them.

class MetadataBuilder {
 public:
  MetadataBuilder(std::string arch, std::vector<KeyValue>* out) : arch_(std::move(arch)), out_(out) {}
  void u32(std::string_view key, int64_t v) { put(key, Value::of_uint(ValueType::kUint32, uint64_t(v))); }
  void f32(std::string_view key, double v) { put(key, Value::of_float(ValueType::kFloat32, v)); }
  void boolean(std::string_view key, bool v) { put(key, Value::of_bool(v)); }
  void str(std::string_view key, std::string v) { put(key, Value::of_string(std::move(v))); }
  void i32_array(std::string_view key, const std::vector<int64_t>& items) {
    std::vector<Value> values;
    values.reserve(items.size());
    for (int64_t v : items) values.push_back(Value::of_int(ValueType::kInt32, v));
    put(key, Value::of_array(ValueType::kInt32, std::move(values)));
  }
  void bool_array(std::string_view key, const std::vector<bool>& items) {
    std::vector<Value> values;
    values.reserve(items.size());
    for (bool v : items) values.push_back(Value::of_bool(v));
    put(key, Value::of_array(ValueType::kBool, std::move(values)));
  }

 private:
  void put(std::string_view key, Value v) { out_->push_back({arch_ + "." + std::string(key), std::move(v)}); }
  std::string arch_;
  std::vector<KeyValue>* out_;
};

// ---- common hyperparameters ------------------------------------------------------------------------------
// The fields every decoder-only transformer here shares, read with transformers' defaults where the
// config may omit a field, and refused where a guess could silently change the model.

struct RopeScaling {
  std::string type;  // "linear" or "yarn" (llama.cpp's rope.scaling.type names)
  double factor = 1;
  int64_t original_context = 0;
  std::optional<double> ext_factor, attn_factor, beta_fast, beta_slow;
};

struct CommonParams {
  int64_t n_vocab = 0, n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  std::optional<int64_t> n_ctx, n_ff;
  double rope_theta = 0, rms_eps = 0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_embeddings = false, attention_bias = false;
  // The window transformers 5 applies: `sliding_window` only when `use_sliding_window` is true, because
  // Qwen3Config/Qwen3MoeConfig.__post_init__ set sliding_window = None otherwise (published Qwen3 configs
  // say use_sliding_window=false, sliding_window=4096 or 32768: no window). Once non-null, Qwen3-MoE's
  // attention applies it in every layer (Qwen3MoeAttention reads config.sliding_window; the model builds
  // a sliding-window mask whenever it is set); Qwen3 applies it per config.layer_types.
  std::optional<int64_t> sliding_window;
};

// A required positive integer that fits the u32 GGUF fields it feeds.
Result<int64_t> positive(const JsonObject& c, std::string_view key) {
  MAGNETAR_ASSIGN_OR_RETURN(const int64_t v, c.integer(key));
  if (v <= 0 || v > int64_t(UINT32_MAX)) {
    return Status::error(format("%s: field '%.*s' is %lld, expected a positive 32-bit integer", c.source().c_str(),
                                int(key.size()), key.data(), (long long)v));
  }
  return v;
}

// Sizes that allocate per unit before any tensor is checked against them (layers, vocabulary entries) or multiply
// into a byte count (heads x head size) have a ceiling far above any real model.
Status at_most(const JsonObject& c, std::string_view key, int64_t v, int64_t limit) {
  if (v <= limit) return Status();
  return Status::error(format("%s: field '%.*s' is %lld, at most %lld supported", c.source().c_str(), int(key.size()),
                              key.data(), (long long)v, (long long)limit));
}

Result<std::optional<int64_t>> optional_positive(const JsonObject& c, std::string_view key) {
  if (!c.has(key)) return std::optional<int64_t>();
  MAGNETAR_ASSIGN_OR_RETURN(const int64_t v, positive(c, key));
  return std::optional<int64_t>(v);
}

Status read_rope(const JsonObject& c, CommonParams* p) {
  // transformers 5 writes rope_parameters {rope_theta, rope_type, ...} (possibly per layer type);
  // transformers 4 wrote rope_theta at top level and rope_scaling {type|rope_type, factor, ...}.
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<JsonObject> params, c.optional_object("rope_parameters"));
  if (params) {
    MAGNETAR_ASSIGN_OR_RETURN(std::optional<JsonObject> full, params->optional_object("full_attention"));
    if (full) params = full;
  }
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<JsonObject> legacy, c.optional_object("rope_scaling"));
  if (params && params->has("rope_theta")) {
    MAGNETAR_ASSIGN_OR_RETURN(p->rope_theta, params->number("rope_theta"));
  } else {
    MAGNETAR_ASSIGN_OR_RETURN(p->rope_theta, c.number("rope_theta"));
  }
  if (!(p->rope_theta > 0)) return Status::error(format("%s: rope theta must be positive", c.source().c_str()));

  const JsonObject* s = params ? &*params : legacy ? &*legacy : nullptr;
  if (!s) return Status();
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<std::string> type, s->optional_string("rope_type"));
  if (!type) {
    MAGNETAR_ASSIGN_OR_RETURN(type, s->optional_string("type"));
  }
  if (!type || *type == "default") return Status();
  RopeScaling r;
  r.type = *type;
  if (*type != "linear" && *type != "yarn") {
    return Status::error(format("%s: RoPE type '%s' is not supported (supported: default, linear, yarn)",
                                c.source().c_str(), type->c_str()));
  }
  MAGNETAR_ASSIGN_OR_RETURN(r.factor, s->number("factor"));
  if (*type == "yarn") {
    MAGNETAR_ASSIGN_OR_RETURN(r.original_context, positive(*s, "original_max_position_embeddings"));
    MAGNETAR_ASSIGN_OR_RETURN(r.ext_factor, s->optional_number("extrapolation_factor"));
    MAGNETAR_ASSIGN_OR_RETURN(r.attn_factor, s->optional_number("attention_factor"));
    if (!r.attn_factor) {
      MAGNETAR_ASSIGN_OR_RETURN(r.attn_factor, s->optional_number("attn_factor"));
    }
    MAGNETAR_ASSIGN_OR_RETURN(r.beta_fast, s->optional_number("beta_fast"));
    MAGNETAR_ASSIGN_OR_RETURN(r.beta_slow, s->optional_number("beta_slow"));
  }
  p->rope_scaling = r;
  return Status();
}

Result<CommonParams> read_common(const JsonObject& c) {
  CommonParams p;
  MAGNETAR_ASSIGN_OR_RETURN(p.n_vocab, positive(c, "vocab_size"));
  MAGNETAR_ASSIGN_OR_RETURN(p.n_layer, positive(c, "num_hidden_layers"));
  MAGNETAR_ASSIGN_OR_RETURN(p.n_embd, positive(c, "hidden_size"));
  MAGNETAR_ASSIGN_OR_RETURN(p.n_head, positive(c, "num_attention_heads"));
  // Absent: multi-head attention, as transformers assumes.
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<int64_t> n_head_kv, optional_positive(c, "num_key_value_heads"));
  p.n_head_kv = n_head_kv.value_or(p.n_head);
  if (p.n_head % p.n_head_kv != 0) {
    return Status::error(format("%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                                c.source().c_str(), (long long)p.n_head, (long long)p.n_head_kv));
  }
  // transformers 5 may omit head_dim; the attention then uses hidden_size / num_attention_heads.
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, optional_positive(c, "head_dim"));
  if (!head_dim && p.n_embd % p.n_head != 0) {
    return Status::error(format("%s: no head_dim and hidden_size %lld is not a multiple of num_attention_heads %lld",
                                c.source().c_str(), (long long)p.n_embd, (long long)p.n_head));
  }
  p.head_dim = head_dim.value_or(p.n_embd / p.n_head);
  MAGNETAR_RETURN_IF_ERROR(at_most(c, "vocab_size", p.n_vocab, int64_t(1) << 24));
  MAGNETAR_RETURN_IF_ERROR(at_most(c, "num_hidden_layers", p.n_layer, 65536));
  MAGNETAR_RETURN_IF_ERROR(at_most(c, "num_attention_heads", p.n_head, 65536));
  MAGNETAR_RETURN_IF_ERROR(at_most(c, "head_dim", p.head_dim, 65536));
  MAGNETAR_ASSIGN_OR_RETURN(p.n_ctx, optional_positive(c, "max_position_embeddings"));
  MAGNETAR_ASSIGN_OR_RETURN(p.n_ff, optional_positive(c, "intermediate_size"));
  MAGNETAR_ASSIGN_OR_RETURN(p.rms_eps, c.number("rms_norm_eps"));
  MAGNETAR_RETURN_IF_ERROR(read_rope(c, &p));
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<bool> tie, c.optional_bool("tie_word_embeddings"));
  p.tie_embeddings = tie.value_or(false);  // the Qwen3 configs' default
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<bool> bias, c.optional_bool("attention_bias"));
  p.attention_bias = bias.value_or(false);
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<bool> use_window, c.optional_bool("use_sliding_window"));
  MAGNETAR_ASSIGN_OR_RETURN(std::optional<int64_t> window, c.optional_integer("sliding_window"));
  if (use_window.value_or(false) && window) {
    MAGNETAR_ASSIGN_OR_RETURN(p.sliding_window, optional_positive(c, "sliding_window"));
  }
  return p;
}

// llama.cpp's TextModel.set_gguf_parameters order, up to the architecture-specific keys.
void put_common(const CommonParams& p, MetadataBuilder* m) {
  m->u32("block_count", p.n_layer);
  if (p.n_ctx) m->u32("context_length", *p.n_ctx);
  m->u32("embedding_length", p.n_embd);
  if (p.n_ff) m->u32("feed_forward_length", *p.n_ff);
  m->u32("attention.head_count", p.n_head);
  m->u32("attention.head_count_kv", p.n_head_kv);
  if (const std::optional<RopeScaling>& r = p.rope_scaling) {
    m->str("rope.scaling.type", r->type);
    m->f32("rope.scaling.factor", r->factor);
    if (r->type == "yarn") {
      m->u32("rope.scaling.original_context_length", r->original_context);
      if (r->ext_factor) m->f32("rope.scaling.yarn_ext_factor", *r->ext_factor);
      if (r->attn_factor) m->f32("rope.scaling.yarn_attn_factor", *r->attn_factor);
      if (r->beta_fast) m->f32("rope.scaling.yarn_beta_fast", *r->beta_fast);
      if (r->beta_slow) m->f32("rope.scaling.yarn_beta_slow", *r->beta_slow);
    }
  }
  m->f32("rope.freq_base", p.rope_theta);
  m->f32("attention.layer_norm_rms_epsilon", p.rms_eps);
}

// llama.cpp writes these only when config.json has head_dim; we always do, with the derived value when it
// is absent, which is what llama.cpp's loader assumes then (n_embd / n_head).
void put_head_dims(const CommonParams& p, MetadataBuilder* m) {
  m->u32("attention.key_length", p.head_dim);
  m->u32("attention.value_length", p.head_dim);
}

// ---- tensors --------------------------------------------------------------------------------------------
// Validates source tensors (present, float dtype, exact shape) and records which were used, so that a
// checkpoint tensor no mapping consumed is reported instead of silently dropped.

std::vector<int64_t> reversed(std::vector<int64_t> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

int64_t rows_of(const SafeTensor& t) {
  return t.shape.empty() ? 1 : t.n_elements() / std::max<int64_t>(1, t.shape.back());
}

class TensorPlanner {
 public:
  TensorPlanner(const HfModel& model, std::vector<PlannedTensor>* out) : model_(model), out_(out) {}

  bool has(const std::string& hf_name) const { return model_.find_tensor(hf_name) != nullptr; }
  void consume(const std::string& hf_name) { used_.insert(hf_name); }

  Result<const SafeTensor*> require(const std::string& hf_name, const std::vector<int64_t>& shape,
                                    const std::string& needed_for) {
    const SafeTensor* t = model_.find_tensor(hf_name);
    if (!t) {
      return Status::error(format("%s: tensor '%s' is missing (needed for %s)", model_.dir().c_str(), hf_name.c_str(),
                                  needed_for.c_str()));
    }
    const std::string file(t->file);
    if (t->shape != shape) {
      return Status::error(format("%s: tensor '%s' has shape %s, expected %s", file.c_str(), hf_name.c_str(),
                                  shape_string(t->shape).c_str(), shape_string(shape).c_str()));
    }
    if (t->dtype != Dtype::kF32 && t->dtype != Dtype::kF16 && t->dtype != Dtype::kBF16) {
      return Status::error(format("%s: tensor '%s' has dtype %s; only F32, F16 and BF16 can be converted", file.c_str(),
                                  hf_name.c_str(), std::string(dtype_name(t->dtype)).c_str()));
    }
    used_.insert(hf_name);
    return t;
  }

  // One source tensor of PyTorch shape `shape` becomes `name` (ggml dims: the shape reversed).
  Status add(std::string name, const std::string& hf_name, const std::vector<int64_t>& shape, TensorKind kind) {
    MAGNETAR_ASSIGN_OR_RETURN(const SafeTensor* t, require(hf_name, shape, name));
    out_->push_back({std::move(name), reversed(shape), kind, {{t, 0, rows_of(*t)}}});
    return Status();
  }

  // Per-expert tensors of equal shape stacked into one tensor with the expert as the outermost dimension:
  // expert e occupies slice e (ggml ne[2] = e), as llama.cpp's torch.stack(dim=0) lays them out.
  Status add_stacked(std::string name, const std::vector<std::string>& hf_names, const std::vector<int64_t>& shape,
                     TensorKind kind) {
    PlannedTensor p{std::move(name), reversed(shape), kind, {}};
    p.ne.push_back(int64_t(hf_names.size()));
    for (const std::string& hf : hf_names) {
      MAGNETAR_ASSIGN_OR_RETURN(const SafeTensor* t, require(hf, shape, p.name));
      p.sources.push_back({t, 0, rows_of(*t)});
    }
    out_->push_back(std::move(p));
    return Status();
  }

  // Rows [row_begin, row_begin + n_rows) of every expert's matrix of a fused [n_expert, rows, cols] tensor
  // (transformers 5's gate_up_proj holds gate rows then up rows), stacked by expert.
  void add_fused_rows(std::string name, const SafeTensor* fused, int64_t row_begin, int64_t n_rows, TensorKind kind) {
    const int64_t n_expert = fused->shape[0], rows = fused->shape[1], cols = fused->shape[2];
    PlannedTensor p{std::move(name), {cols, n_rows, n_expert}, kind, {}};
    for (int64_t e = 0; e < n_expert; ++e) p.sources.push_back({fused, e * rows + row_begin, n_rows});
    out_->push_back(std::move(p));
  }

  // Every checkpoint tensor must have been used, except RoPE caches some old checkpoints carry.
  Status check_all_used(std::string_view arch) const {
    std::vector<const SafeTensor*> unused;
    for (const SafeTensor* t : model_.tensors()) {
      const bool rope_cache = t->name.ends_with("rotary_emb.inv_freq");
      if (!used_.count(t->name) && !rope_cache) unused.push_back(t);
    }
    if (unused.empty()) return Status();
    return Status::error(format("%s: tensor '%s' is not part of the %.*s mapping%s",
                                std::string(unused[0]->file).c_str(), unused[0]->name.c_str(), int(arch.size()),
                                arch.data(),
                                unused.size() > 1 ? format(" (and %zu more)", unused.size() - 1).c_str() : ""));
  }

 private:
  const HfModel& model_;
  std::vector<PlannedTensor>* out_;
  std::unordered_set<std::string> used_;
};

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }
std::string block_prefix(int64_t l) { return "blk." + std::to_string(l) + "."; }

// Self-attention with Qwen3's per-head RMS norms on q and k, and the two pre-norms of the block.
Status plan_attention(const CommonParams& p, int64_t l, TensorPlanner* tp) {
  const std::string hf = layer_prefix(l), gg = block_prefix(l);
  const int64_t q_dim = p.n_head * p.head_dim, kv_dim = p.n_head_kv * p.head_dim;
  const TensorKind w = TensorKind::kWeight;
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_norm.weight", hf + "input_layernorm.weight", {p.n_embd}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_q.weight", hf + "self_attn.q_proj.weight", {q_dim, p.n_embd}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_k.weight", hf + "self_attn.k_proj.weight", {kv_dim, p.n_embd}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_v.weight", hf + "self_attn.v_proj.weight", {kv_dim, p.n_embd}, w));
  if (p.attention_bias) {
    MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_q.bias", hf + "self_attn.q_proj.bias", {q_dim}, w));
    MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_k.bias", hf + "self_attn.k_proj.bias", {kv_dim}, w));
    MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_v.bias", hf + "self_attn.v_proj.bias", {kv_dim}, w));
  }
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_output.weight", hf + "self_attn.o_proj.weight", {p.n_embd, q_dim}, w));
  if (p.attention_bias) {
    MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_output.bias", hf + "self_attn.o_proj.bias", {p.n_embd}, w));
  }
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_q_norm.weight", hf + "self_attn.q_norm.weight", {p.head_dim}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "attn_k_norm.weight", hf + "self_attn.k_norm.weight", {p.head_dim}, w));
  return tp->add(gg + "ffn_norm.weight", hf + "post_attention_layernorm.weight", {p.n_embd}, w);
}

// SwiGLU MLP of width n_ff under llama.cpp's dense names.
Status plan_dense_ffn(const CommonParams& p, int64_t n_ff, int64_t l, TensorPlanner* tp) {
  const std::string hf = layer_prefix(l) + "mlp.", gg = block_prefix(l);
  const TensorKind w = TensorKind::kWeight;
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "ffn_gate.weight", hf + "gate_proj.weight", {n_ff, p.n_embd}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add(gg + "ffn_up.weight", hf + "up_proj.weight", {n_ff, p.n_embd}, w));
  return tp->add(gg + "ffn_down.weight", hf + "down_proj.weight", {p.n_embd, n_ff}, w);
}

// Router plus routed experts, from either checkpoint layout: per-expert matrices
// (mlp.experts.E.{gate,up,down}_proj.weight, what transformers 4 writes and 5 writes by default) or fused
// 3-D tensors (mlp.experts.gate_up_proj [E, 2*n_ff, n_embd], mlp.experts.down_proj [E, n_embd, n_ff],
// transformers 5's in-memory layout, saved as-is with save_original_format=False).
Status plan_moe_ffn(const CommonParams& p, int64_t n_expert, int64_t n_ff, int64_t l, TensorPlanner* tp) {
  const std::string hf = layer_prefix(l) + "mlp.", gg = block_prefix(l);
  const TensorKind w = TensorKind::kWeight;
  MAGNETAR_RETURN_IF_ERROR(
      tp->add(gg + "ffn_gate_inp.weight", hf + "gate.weight", {n_expert, p.n_embd}, TensorKind::kKeepF32));
  std::string fused_gate_up = hf + "experts.gate_up_proj", fused_down = hf + "experts.down_proj";
  if (!tp->has(fused_gate_up) && tp->has(fused_gate_up + ".weight")) fused_gate_up += ".weight";
  if (!tp->has(fused_down) && tp->has(fused_down + ".weight")) fused_down += ".weight";
  if (tp->has(fused_gate_up)) {
    MAGNETAR_ASSIGN_OR_RETURN(const SafeTensor* gate_up,
                              tp->require(fused_gate_up, {n_expert, 2 * n_ff, p.n_embd}, gg + "ffn_gate_exps.weight"));
    tp->add_fused_rows(gg + "ffn_gate_exps.weight", gate_up, 0, n_ff, w);
    tp->add_fused_rows(gg + "ffn_up_exps.weight", gate_up, n_ff, n_ff, w);
    return tp->add(gg + "ffn_down_exps.weight", fused_down, {n_expert, p.n_embd, n_ff}, w);
  }
  std::vector<std::string> gate, up, down;
  for (int64_t e = 0; e < n_expert; ++e) {
    const std::string x = hf + "experts." + std::to_string(e) + ".";
    gate.push_back(x + "gate_proj.weight");
    up.push_back(x + "up_proj.weight");
    down.push_back(x + "down_proj.weight");
  }
  MAGNETAR_RETURN_IF_ERROR(tp->add_stacked(gg + "ffn_gate_exps.weight", gate, {n_ff, p.n_embd}, w));
  MAGNETAR_RETURN_IF_ERROR(tp->add_stacked(gg + "ffn_up_exps.weight", up, {n_ff, p.n_embd}, w));
  return tp->add_stacked(gg + "ffn_down_exps.weight", down, {p.n_embd, n_ff}, w);
}

Status plan_embeddings(const CommonParams& p, TensorPlanner* tp) {
  return tp->add("token_embd.weight", "model.embed_tokens.weight", {p.n_vocab, p.n_embd}, TensorKind::kWeight);
}

// With tied embeddings llama.cpp writes no output.weight (the runtime reuses token_embd); a checkpoint
// that still carries lm_head.weight then has it ignored, as transformers ignores it when tying.
Status plan_head(const CommonParams& p, TensorPlanner* tp) {
  MAGNETAR_RETURN_IF_ERROR(tp->add("output_norm.weight", "model.norm.weight", {p.n_embd}, TensorKind::kWeight));
  if (p.tie_embeddings) {
    tp->consume("lm_head.weight");
    return Status();
  }
  return tp->add("output.weight", "lm_head.weight", {p.n_vocab, p.n_embd}, TensorKind::kWeight);
}

// ---- Qwen3ForCausalLM -> qwen3 ---------------------------------------------------------------------------

Result<ModelPlan> plan_qwen3(const HfModel& model, bool with_weights) {
  const JsonObject& c = model.config();
  MAGNETAR_ASSIGN_OR_RETURN(const CommonParams p, read_common(c));
  if (!p.n_ff) return Status::error(format("%s: field 'intermediate_size' is missing", c.source().c_str()));
  ModelPlan plan{.arch = "qwen3", .n_vocab = p.n_vocab, .metadata = {}, .tensors = {}};
  MetadataBuilder m(plan.arch, &plan.metadata);
  put_common(p, &m);
  put_head_dims(p, &m);
  if (p.sliding_window) {
    // Qwen3Config: layer i slides when layer_types[i] says so, else when i >= max_window_layers.
    MAGNETAR_ASSIGN_OR_RETURN(const std::vector<std::string> types, c.string_array("layer_types"));
    MAGNETAR_ASSIGN_OR_RETURN(const std::optional<int64_t> max_window_layers, c.optional_integer("max_window_layers"));
    if (!types.empty() && int64_t(types.size()) != p.n_layer) {
      return Status::error(format("%s: field 'layer_types' has %zu entries for %lld layers", c.source().c_str(),
                                  types.size(), (long long)p.n_layer));
    }
    std::vector<bool> sliding(size_t(p.n_layer));
    for (int64_t l = 0; l < p.n_layer; ++l) {
      sliding[size_t(l)] =
          types.empty() ? l >= max_window_layers.value_or(28) : types[size_t(l)] == "sliding_attention";
    }
    if (std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
      m.u32("attention.sliding_window", *p.sliding_window);
      // llama.cpp's per-layer form of the key (true = sliding); omitted when every layer slides.
      if (std::find(sliding.begin(), sliding.end(), false) != sliding.end()) {
        m.bool_array("attention.sliding_window_pattern", sliding);
      }
    }
  }
  if (!with_weights) return plan;

  TensorPlanner tp(model, &plan.tensors);
  MAGNETAR_RETURN_IF_ERROR(plan_embeddings(p, &tp));
  for (int64_t l = 0; l < p.n_layer; ++l) {
    MAGNETAR_RETURN_IF_ERROR(plan_attention(p, l, &tp));
    MAGNETAR_RETURN_IF_ERROR(plan_dense_ffn(p, *p.n_ff, l, &tp));
  }
  MAGNETAR_RETURN_IF_ERROR(plan_head(p, &tp));
  MAGNETAR_RETURN_IF_ERROR(tp.check_all_used(plan.arch));
  return plan;
}

// ---- Qwen3MoeForCausalLM -> qwen3moe ---------------------------------------------------------------------

Result<ModelPlan> plan_qwen3moe(const HfModel& model, bool with_weights) {
  const JsonObject& c = model.config();
  MAGNETAR_ASSIGN_OR_RETURN(const CommonParams p, read_common(c));
  // Published configs say num_experts; transformers 5 writes num_local_experts (its attribute_map aliases
  // the two). Read both; refuse a config where they disagree.
  MAGNETAR_ASSIGN_OR_RETURN(const std::optional<int64_t> local, optional_positive(c, "num_local_experts"));
  MAGNETAR_ASSIGN_OR_RETURN(const std::optional<int64_t> experts, optional_positive(c, "num_experts"));
  if (local && experts && *local != *experts) {
    return Status::error(format("%s: num_local_experts %lld and num_experts %lld disagree", c.source().c_str(),
                                (long long)*local, (long long)*experts));
  }
  if (!local && !experts) {
    return Status::error(format("%s: field 'num_experts' (or 'num_local_experts') is missing", c.source().c_str()));
  }
  const int64_t n_expert = local ? *local : *experts;
  MAGNETAR_ASSIGN_OR_RETURN(const int64_t n_expert_used, positive(c, "num_experts_per_tok"));
  if (n_expert_used > n_expert) {
    return Status::error(format("%s: num_experts_per_tok %lld exceeds the %lld experts", c.source().c_str(),
                                (long long)n_expert_used, (long long)n_expert));
  }
  MAGNETAR_ASSIGN_OR_RETURN(const int64_t n_ff_exp, positive(c, "moe_intermediate_size"));
  MAGNETAR_ASSIGN_OR_RETURN(const std::optional<bool> norm_topk, c.optional_bool("norm_topk_prob"));
  MAGNETAR_ASSIGN_OR_RETURN(const std::optional<int64_t> step, optional_positive(c, "decoder_sparse_step"));
  MAGNETAR_ASSIGN_OR_RETURN(const std::vector<int64_t> mlp_only, c.integer_array("mlp_only_layers"));
  for (int64_t l : mlp_only) {
    if (l < 0 || l >= p.n_layer) {
      return Status::error(format("%s: field 'mlp_only_layers' lists layer %lld of %lld", c.source().c_str(),
                                  (long long)l, (long long)p.n_layer));
    }
  }
  // Qwen2MoeDecoderLayer's rule: a layer is sparse unless listed in mlp_only_layers or
  // (layer + 1) % decoder_sparse_step != 0; dense layers use an MLP of intermediate_size.
  std::vector<int64_t> dense_layers;
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const bool listed = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
    if (listed || (l + 1) % step.value_or(1) != 0) dense_layers.push_back(l);
  }
  if (!dense_layers.empty() && !p.n_ff) {
    return Status::error(format("%s: field 'intermediate_size' is missing (layer %lld uses a dense MLP)",
                                c.source().c_str(), (long long)dense_layers[0]));
  }

  ModelPlan plan{.arch = "qwen3moe", .n_vocab = p.n_vocab, .metadata = {}, .tensors = {}};
  MetadataBuilder m(plan.arch, &plan.metadata);
  put_common(p, &m);
  m.u32("expert_count", n_expert);
  m.u32("expert_used_count", n_expert_used);
  put_head_dims(p, &m);
  m.u32("expert_feed_forward_length", n_ff_exp);
  if (p.sliding_window) m.u32("attention.sliding_window", *p.sliding_window);
  // Not written by llama.cpp, whose qwen3moe graph always renormalizes the top-k weights; the flag makes
  // a model with norm_topk_prob=false (transformers' default) run as transformers runs it.
  m.boolean("expert_weights_norm", norm_topk.value_or(false));
  // llama.cpp has no key for dense layers in qwen3moe; this one lists every layer whose FFN is dense
  // (from mlp_only_layers and decoder_sparse_step together), absent when all layers are MoE.
  if (!dense_layers.empty()) m.i32_array("mlp_only_layers", dense_layers);
  if (!with_weights) return plan;

  TensorPlanner tp(model, &plan.tensors);
  MAGNETAR_RETURN_IF_ERROR(plan_embeddings(p, &tp));
  for (int64_t l = 0; l < p.n_layer; ++l) {
    MAGNETAR_RETURN_IF_ERROR(plan_attention(p, l, &tp));
    if (std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end()) {
      MAGNETAR_RETURN_IF_ERROR(plan_dense_ffn(p, *p.n_ff, l, &tp));
    } else {
      MAGNETAR_RETURN_IF_ERROR(plan_moe_ffn(p, n_expert, n_ff_exp, l, &tp));
    }
  }
  MAGNETAR_RETURN_IF_ERROR(plan_head(p, &tp));
  MAGNETAR_RETURN_IF_ERROR(tp.check_all_used(plan.arch));
  return plan;
}

// One row per supported architecture, sorted by HF name.
constexpr Architecture kArchitectures[] = {
    {"Qwen3ForCausalLM", "qwen3", plan_qwen3},
    {"Qwen3MoeForCausalLM", "qwen3moe", plan_qwen3moe},
};

}  // namespace

int64_t PlannedTensor::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

std::span<const Architecture> architectures() { return kArchitectures; }

const Architecture* find_architecture(std::string_view hf_name) {
  for (const Architecture& a : kArchitectures) {
    if (a.hf_name == hf_name) return &a;
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.hf_name);
  return s;
}

}  // namespace magnetar::convert
