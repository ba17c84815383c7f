// experts/layout and experts/pack on small synthetic MoE files: the standard layout matches the stacked
// tensors' slices, packing moves every expert's bytes (any mix of types) into aligned records and nothing
// else, verify finds the first differing byte, and every malformed input is a one-line error naming the thing.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "experts/layout.h"
#include "experts/pack.h"
#include "models/common/binder.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::experts {
namespace {

using gguf::Value;
using gguf::ValueType;
using testing::TempDir;

constexpr int64_t kEmbd = 256, kFf = 512, kExperts = 8;

// Per layer: the types of gate, up and down, or dense (no experts: a plain F16 FFN instead).
struct LayerSpec {
  bool moe;
  quant::Type gate, up, down;
};

// Byte i of tensor k: a hash, so any misplaced slab shows up as a difference.
uint8_t byte_of(uint64_t tensor, uint64_t i) {
  uint64_t x = tensor * 0x9E3779B97F4A7C15ull + i;
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
  return uint8_t(x >> 29);
}

struct TensorDef {
  std::string name;
  uint32_t type;
  std::vector<int64_t> dims;
};

// Writes a qwen3moe-like file; `edit` may change the tensor list before it is written.
void write_model(const std::string& path, const std::vector<LayerSpec>& layers,
                 const std::function<void(std::vector<TensorDef>&)>& edit = nullptr, int64_t meta_experts = kExperts) {
  std::vector<TensorDef> defs;
  const uint32_t f32 = uint32_t(quant::Type::F32), f16 = uint32_t(quant::Type::F16);
  defs.push_back({"token_embd.weight", f32, {kEmbd, 64}});
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    defs.push_back({p + "attn_norm.weight", f32, {kEmbd}});
    defs.push_back({p + "attn_q.weight", uint32_t(quant::Type::Q8_0), {kEmbd, kEmbd}});
    if (layers[l].moe) {
      defs.push_back({p + "ffn_gate_inp.weight", f32, {kEmbd, kExperts}});
      defs.push_back({p + "ffn_gate_exps.weight", uint32_t(layers[l].gate), {kEmbd, kFf, kExperts}});
      defs.push_back({p + "ffn_up_exps.weight", uint32_t(layers[l].up), {kEmbd, kFf, kExperts}});
      defs.push_back({p + "ffn_down_exps.weight", uint32_t(layers[l].down), {kFf, kEmbd, kExperts}});
    } else {
      defs.push_back({p + "ffn_gate.weight", f16, {kEmbd, kFf}});
      defs.push_back({p + "ffn_up.weight", f16, {kEmbd, kFf}});
      defs.push_back({p + "ffn_down.weight", f16, {kFf, kEmbd}});
    }
  }
  defs.push_back({"output_norm.weight", f32, {kEmbd}});
  defs.push_back({"output.weight", uint32_t(quant::Type::Q8_0), {kEmbd, 64}});
  if (edit) edit(defs);

  gguf::Writer w(path);
  w.set("general.architecture", Value::of_string("qwen3moe"));
  w.set("general.name", Value::of_string("pack test"));
  w.set("qwen3moe.block_count", Value::of_uint(ValueType::kUint32, layers.size()));
  w.set("qwen3moe.expert_count", Value::of_uint(ValueType::kUint32, uint64_t(meta_experts)));
  w.set("tokenizer.ggml.tokens", Value::of_strings({"a", "b"}));
  for (const TensorDef& d : defs) ASSERT_TRUE(w.add_tensor(d.name, d.type, d.dims).ok()) << d.name;
  ASSERT_TRUE(w.begin().ok());
  for (size_t k = 0; k < w.tensors().size(); ++k) {
    std::vector<uint8_t> data(w.tensors()[k].nbytes);
    for (size_t i = 0; i < data.size(); ++i) data[i] = byte_of(k, i);
    ASSERT_TRUE(w.write(data).ok());
  }
  ASSERT_TRUE(w.finish().ok());
}

const std::vector<LayerSpec> kMixed = {
    {true, quant::Type::Q4_K, quant::Type::Q4_K, quant::Type::Q6_K},
    {false, {}, {}, {}},
    {true, quant::Type::Q8_0, quant::Type::Q8_0, quant::Type::Q8_0},
    {true, quant::Type::F16, quant::Type::Q4_0, quant::Type::BF16},
};

std::unique_ptr<gguf::Model> open_or_die(const std::string& path) {
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::string layout_error(const std::string& path) {
  std::unique_ptr<gguf::Model> m = open_or_die(path);
  if (!m) return "(cannot open)";
  Result<ExpertLayout> layout = ExpertLayout::from_model(*m);
  return layout.ok() ? "(no error)" : layout.status().message();
}

const uint8_t* bytes_at(const gguf::Model& m, const Extent& x) { return m.shards()[x.shard]->bytes() + x.offset; }

// ---- Standard layout ---------------------------------------------------------------------------------------

TEST(ExpertLayout, StandardMatchesTensorSlices) {
  TempDir dir;
  write_model(dir.file("m.gguf"), kMixed);
  std::unique_ptr<gguf::Model> m = open_or_die(dir.file("m.gguf"));
  Result<ExpertLayout> layout = ExpertLayout::from_model(*m);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_FALSE(layout->packed());
  EXPECT_EQ(layout->n_layer(), 4);
  EXPECT_EQ(layout->n_moe_layers(), 3);
  EXPECT_EQ(layout->n_expert(), kExperts);
  EXPECT_FALSE(layout->has_experts(1));
  EXPECT_FALSE(layout->has_experts(4));
  uint64_t total = 0;
  for (int64_t l : {0, 2, 3}) {
    for (int p = 0; p < kParts; ++p) {
      const PartDesc& d = layout->part(l, Part(p));
      const gguf::TensorInfo* t = m->find_tensor(part_tensor_name(l, Part(p)));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(d.name, t->name);
      EXPECT_EQ(uint32_t(d.type), t->type_id);
      EXPECT_EQ(d.bytes_per_expert * kExperts, t->nbytes);
      EXPECT_EQ(d.bytes_per_expert, quant::row_size(d.type, d.ne[0]) * uint64_t(d.ne[1]));
      for (int64_t e = 0; e < kExperts; ++e) {
        const Extent x = layout->extent(l, e, Part(p));
        EXPECT_EQ(x.bytes, d.bytes_per_expert);
        EXPECT_EQ(bytes_at(*m, x), t->data + e * d.bytes_per_expert);
      }
    }
    EXPECT_FALSE(layout->record(l, 0).has_value());
    EXPECT_EQ(layout->record_stride(l), 0u);
    total += layout->expert_bytes(l) * kExperts;
  }
  EXPECT_EQ(layout->total_expert_bytes(), total);
}

TEST(ExpertLayout, DenseModelHasNoExperts) {
  TempDir dir;
  write_model(dir.file("m.gguf"), {{false, {}, {}, {}}, {false, {}, {}, {}}});
  std::unique_ptr<gguf::Model> m = open_or_die(dir.file("m.gguf"));
  Result<ExpertLayout> layout = ExpertLayout::from_model(*m);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout->n_moe_layers(), 0);
  EXPECT_EQ(layout->n_layer(), 0);
  const Result<PackPlan> plan = plan_pack(*m);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("no routed experts"), std::string::npos) << plan.status().message();
}

TEST(ExpertLayout, StandardErrorsNameTheTensor) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  auto expect_error = [&](const std::function<void(std::vector<TensorDef>&)>& edit, const std::string& needle,
                          int64_t meta_experts = kExperts) {
    write_model(path, kMixed, edit, meta_experts);
    const std::string msg = layout_error(path);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;  // names the file first
  };
  // A layer with only some parts.
  expect_error(
      [](std::vector<TensorDef>& d) { std::erase_if(d, [](auto& t) { return t.name == "blk.2.ffn_up_exps.weight"; }); },
      "tensor 'blk.2.ffn_up_exps.weight': missing");
  // Wrong expert count in one part.
  expect_error(
      [](std::vector<TensorDef>& d) {
        for (auto& t : d)
          if (t.name == "blk.3.ffn_down_exps.weight") t.dims[2] = kExperts - 1;
      },
      "tensor 'blk.3.ffn_down_exps.weight': 7 experts");
  // Not three-dimensional.
  expect_error(
      [](std::vector<TensorDef>& d) {
        for (auto& t : d)
          if (t.name == "blk.0.ffn_gate_exps.weight") t.dims = {kEmbd, kFf * kExperts};
      },
      "tensor 'blk.0.ffn_gate_exps.weight': shape [256, 4096] is not [n_in, n_out, n_expert]");
  // Disagrees with the metadata's expert count.
  expect_error(nullptr, "metadata 'qwen3moe.expert_count' is 16", 16);
  // Packed-layout tensors without the pack keys.
  expect_error(
      [](std::vector<TensorDef>& d) {
        d.push_back({kTableTensor, quant::kTypeIdI64, {4, 3}});
      },
      "tensor 'magnetar.expert_table': a packed-layout tensor");
}

TEST(ExpertLayout, PartNames) {
  EXPECT_EQ(part_tensor_name(7, Part::kDown), "blk.7.ffn_down_exps.weight");
  EXPECT_EQ(packed_tensor_name(7), "blk.7.ffn_exps_packed");
  const std::optional<PartName> pn = parse_part_tensor_name("blk.12.ffn_up_exps.weight");
  ASSERT_TRUE(pn.has_value());
  EXPECT_EQ(pn->layer, 12);
  EXPECT_EQ(pn->part, Part::kUp);
  for (const char* bad : {"blk.03.ffn_up_exps.weight", "blk.-1.ffn_up_exps.weight", "blk.1.ffn_up_exps.bias",
                          "blk.1.ffn_up_shexp.weight", "blk..ffn_up_exps.weight", "blk.1.ffn_gate_up_exps.weight"}) {
    EXPECT_FALSE(parse_part_tensor_name(bad).has_value()) << bad;
  }
}

// ---- Packing -----------------------------------------------------------------------------------------------

struct Packed {
  TempDir dir;
  std::unique_ptr<gguf::Model> source, packed;
};

std::unique_ptr<Packed> pack_mixed() {
  auto p = std::make_unique<Packed>();
  write_model(p->dir.file("in.gguf"), kMixed);
  p->source = open_or_die(p->dir.file("in.gguf"));
  uint64_t last_done = 0, calls = 0;
  const PackOptions options{.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    EXPECT_LE(done, total);
    last_done = done;
    ++calls;
  }};
  const Status s = pack(*p->source, p->dir.file("out.gguf"), options);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_GT(calls, 0u);
  uint64_t tensor_bytes = 0;
  for (const gguf::TensorInfo& t : p->source->tensors()) tensor_bytes += t.nbytes;
  EXPECT_EQ(last_done, tensor_bytes);
  p->packed = open_or_die(p->dir.file("out.gguf"));
  return p;
}

TEST(Pack, EveryExpertByteLandsInAnAlignedRecord) {
  std::unique_ptr<Packed> p = pack_mixed();
  ASSERT_TRUE(p->packed);
  const gguf::Model &src = *p->source, &out = *p->packed;
  Result<ExpertLayout> ls = ExpertLayout::from_model(src);
  Result<ExpertLayout> lp = ExpertLayout::from_model(out);
  ASSERT_TRUE(ls.ok() && lp.ok()) << lp.status().message();
  ASSERT_TRUE(lp->packed());
  EXPECT_EQ(out.shards()[0]->header().alignment, 4096u);
  EXPECT_EQ(lp->n_layer(), 4);
  EXPECT_FALSE(lp->has_experts(1));
  for (int64_t l : {0, 2, 3}) {
    EXPECT_EQ(lp->record_stride(l) % kPackAlignment, 0u);
    EXPECT_GE(lp->record_stride(l), lp->expert_bytes(l));
    EXPECT_LT(lp->record_stride(l), lp->expert_bytes(l) + kPackAlignment);
    for (int p2 = 0; p2 < kParts; ++p2) {
      EXPECT_EQ(lp->part(l, Part(p2)).name, ls->part(l, Part(p2)).name);
      EXPECT_EQ(lp->part(l, Part(p2)).type, ls->part(l, Part(p2)).type);
      EXPECT_EQ(lp->part(l, Part(p2)).ne, ls->part(l, Part(p2)).ne);
    }
    for (int64_t e = 0; e < kExperts; ++e) {
      const Extent r = *lp->record(l, e);
      EXPECT_EQ(r.offset % kPackAlignment, 0u);
      EXPECT_EQ(r.bytes, lp->record_stride(l));
      uint64_t within = 0;
      for (int p2 = 0; p2 < kParts; ++p2) {
        const Extent a = lp->extent(l, e, Part(p2)), b = ls->extent(l, e, Part(p2));
        ASSERT_EQ(a.bytes, b.bytes);
        EXPECT_EQ(a.offset, r.offset + within);
        within += a.bytes;
        EXPECT_EQ(std::memcmp(bytes_at(out, a), bytes_at(src, b), a.bytes), 0) << l << " " << e << " " << p2;
      }
      for (uint64_t k = within; k < r.bytes; ++k) ASSERT_EQ(bytes_at(out, r)[k], 0) << "padding";
    }
  }
  // Non-expert tensors identical and in order; record tensors where the gate tensors were; the table last.
  std::vector<std::string> expected;
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (const std::optional<PartName> pn = parse_part_tensor_name(t.name)) {
      if (pn->part == Part::kGate) expected.push_back(packed_tensor_name(pn->layer));
      continue;
    }
    expected.push_back(t.name);
    const gguf::TensorInfo* o = out.find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->type_id, t.type_id);
    EXPECT_EQ(o->ne, t.ne);
    EXPECT_EQ(std::memcmp(o->data, t.data, t.nbytes), 0) << t.name;
  }
  expected.push_back(kTableTensor);
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : out.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, expected);
  // Metadata: the source's, in order, then the pack keys.
  size_t k = 0;
  for (const gguf::KeyValue& kv : src.metadata()) {
    ASSERT_LT(k, out.metadata().size());
    EXPECT_EQ(out.metadata()[k].key, kv.key);
    EXPECT_TRUE(out.metadata()[k].value == kv.value) << kv.key;
    ++k;
  }
  EXPECT_EQ(out.metadata()[k].key, "general.alignment");
  EXPECT_EQ(out.find(kKeyPackVersion)->u, 1u);
  EXPECT_EQ(out.find(kKeyPackParts)->array.size(), 9u);
  const Status v = verify(out, src, {});
  EXPECT_TRUE(v.ok()) << v.message();
}

TEST(Pack, RefusesPackedInputAndOverwritingTheInput) {
  std::unique_ptr<Packed> p = pack_mixed();
  ASSERT_TRUE(p->packed);
  const Result<PackPlan> plan = plan_pack(*p->packed);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("already packed"), std::string::npos) << plan.status().message();
  const Status s = pack(*p->packed, p->dir.file("again.gguf"), {});
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(p->dir.file("again.gguf")));
  const Status same = pack(*p->source, p->dir.file("in.gguf"), {});
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.message().find("is the input"), std::string::npos) << same.message();
  // A failed pack leaves no temporary file behind; a successful one neither.
  for (const auto& entry : std::filesystem::directory_iterator(p->dir.file(""))) {
    EXPECT_EQ(entry.path().extension(), ".gguf") << entry.path();
  }
}

// Flips one byte of a copy of the packed file and returns verify's message.
std::string verify_after_flip(Packed& p, uint64_t file_offset) {
  std::vector<uint8_t> bytes = testing::read_all(p.dir.file("out.gguf"));
  EXPECT_LT(file_offset, bytes.size());
  bytes[file_offset] ^= 0x5A;
  testing::write_all(p.dir.file("flipped.gguf"), bytes);
  std::unique_ptr<gguf::Model> flipped = open_or_die(p.dir.file("flipped.gguf"));
  if (!flipped) return "(cannot open)";
  const Status s = verify(*flipped, *p.source, {});
  return s.ok() ? "(ok)" : s.message();
}

TEST(Pack, VerifyNamesTheFirstDifference) {
  std::unique_ptr<Packed> p = pack_mixed();
  ASSERT_TRUE(p->packed);
  Result<ExpertLayout> lp = ExpertLayout::from_model(*p->packed);
  ASSERT_TRUE(lp.ok());
  const Extent up = lp->extent(2, 5, Part::kUp);
  EXPECT_NE(verify_after_flip(*p, up.offset + 100).find("layer 2 expert 5 part up: byte 100 differs"),
            std::string::npos);
  const Extent down = lp->extent(3, 7, Part::kDown);
  EXPECT_NE(verify_after_flip(*p, down.offset + down.bytes - 1)
                .find(format("layer 3 expert 7 part down: byte %llu differs", (unsigned long long)(down.bytes - 1))),
            std::string::npos);
  const Extent r = *lp->record(0, 3);
  const std::string pad = verify_after_flip(*p, r.offset + r.bytes - 1);
  EXPECT_NE(pad.find("layer 0 expert 3: padding byte"), std::string::npos) << pad;
  const gguf::TensorInfo* out = p->packed->find_tensor("output.weight");
  const uint64_t out_offset = p->packed->shards()[0]->header().data_offset + out->offset;
  EXPECT_NE(verify_after_flip(*p, out_offset + 9).find("tensor 'output.weight': byte 9 differs"), std::string::npos);
  // Verifying against the wrong source: metadata first.
  write_model(p->dir.file("other.gguf"), kMixed, nullptr, kExperts);
  {
    std::unique_ptr<gguf::Model> other = open_or_die(p->dir.file("other.gguf"));
    EXPECT_TRUE(verify(*p->packed, *other, {}).ok());  // same content, another file: fine
  }
  write_model(p->dir.file("other.gguf"), {kMixed[0], kMixed[1], kMixed[2], kMixed[0]});
  std::unique_ptr<gguf::Model> other = open_or_die(p->dir.file("other.gguf"));
  const Status s = verify(*p->packed, *other, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 3 part gate"), std::string::npos) << s.message();
}

// ---- Packed layout errors: a packed file rewritten with one thing changed ----------------------------------

// Copies `src` to `path` (alignment 4096) with `kv` edits and byte edits to the table.
void rewrite(const gguf::Model& src, const std::string& path, const std::function<void(gguf::Writer&)>& set_kv,
             const std::function<void(const std::string& name, std::vector<uint8_t>&)>& edit_bytes = nullptr,
             const std::string& drop_tensor = "") {
  gguf::Writer w(path);
  for (const gguf::KeyValue& kv : src.metadata()) w.set(kv.key, kv.value);
  w.set_alignment(4096);
  if (set_kv) set_kv(w);
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (t.name == drop_tensor) continue;
    ASSERT_TRUE(w.add_tensor(t.name, t.type_id, std::span<const int64_t>(t.ne.data(), size_t(t.n_dims))).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (t.name == drop_tensor) continue;
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    if (edit_bytes) edit_bytes(t.name, bytes);
    ASSERT_TRUE(w.write(bytes).ok());
  }
  ASSERT_TRUE(w.finish().ok());
}

TEST(ExpertLayout, PackedErrorsNameTheKeyOrTensor) {
  std::unique_ptr<Packed> p = pack_mixed();
  ASSERT_TRUE(p->packed);
  const std::string path = p->dir.file("bad.gguf");
  auto expect_error = [&](const std::string& needle) {
    const std::string msg = layout_error(path);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  // Identity rewrite is still valid (the checks below fail for the reason they name).
  rewrite(*p->packed, path, nullptr);
  EXPECT_EQ(layout_error(path), "(no error)");

  rewrite(*p->packed, path, [](gguf::Writer& w) { w.set(kKeyPackVersion, Value::of_uint(ValueType::kUint32, 2)); });
  expect_error("metadata 'magnetar.pack.version': unknown pack version 2");
  rewrite(*p->packed, path, [](gguf::Writer& w) { w.set(kKeyPackParts, Value::of_strings({"x", "y"})); });
  expect_error("metadata 'magnetar.pack.parts'");
  rewrite(*p->packed, path, [](gguf::Writer& w) {
    w.set(kKeyPackPartTypes, Value::of_array(ValueType::kUint32, {Value::of_uint(ValueType::kUint32, 12)}));
  });
  expect_error("metadata 'magnetar.pack.part_types'");
  rewrite(*p->packed, path, nullptr, nullptr, kTableTensor);
  expect_error("tensor 'magnetar.expert_table': missing");
  rewrite(*p->packed, path, nullptr, nullptr, "blk.2.ffn_exps_packed");
  expect_error("tensor 'blk.2.ffn_exps_packed': missing");
  // Table rows: an extent past the end of the file, a wrong byte count, a wrong layer.
  auto edit_row = [&](int64_t row, int column, int64_t value) {
    rewrite(*p->packed, path, nullptr, [&](const std::string& name, std::vector<uint8_t>& bytes) {
      if (name == kTableTensor) std::memcpy(bytes.data() + (row * kTableColumns + column) * 8, &value, 8);
    });
  };
  edit_row(4, 0, int64_t(1) << 40);
  expect_error("tensor 'magnetar.expert_table' row 4 (layer 0 expert 1 part up)");
  edit_row(5, 1, 12);
  expect_error("row 5 (layer 0 expert 1 part down): 12 bytes");
  edit_row(3 * kExperts, 3, 7);
  expect_error("row 24 (layer 2 expert 0 part gate): says layer 7");
  edit_row(1, 0, 4096);  // up no longer right after gate
  expect_error("(layer 0 expert 0): the parts do not form one record");
}

// IQ3_S (ggml id 21) has a size but no kernel here: pack refuses it before writing, and a packed file whose metadata
// says IQ3_S (a Q3_K pack relabelled: the same 110 bytes per 256) is an error naming the part when bound (it aborted
// in quant::traits).
TEST(Pack, ExpertTypesWithoutKernelsAreRefused) {
  constexpr uint32_t kIq3S = 21;
  TempDir dir;
  write_model(dir.file("iq.gguf"), {{true, quant::Type(kIq3S), quant::Type(kIq3S), quant::Type::Q8_0}});
  std::unique_ptr<gguf::Model> iq = open_or_die(dir.file("iq.gguf"));
  ASSERT_TRUE(iq);
  const Result<PackPlan> plan = plan_pack(*iq);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("tensor 'blk.0.ffn_gate_exps.weight' has type IQ3_S, which Magnetar cannot "
                                         "compute with"),
            std::string::npos)
      << plan.status().message();

  const quant::Type q3 = quant::Type::Q3_K;
  write_model(dir.file("q3.gguf"), {{true, q3, q3, q3}});
  std::unique_ptr<gguf::Model> q3_model = open_or_die(dir.file("q3.gguf"));
  ASSERT_TRUE(q3_model);
  ASSERT_TRUE(pack(*q3_model, dir.file("q3_packed.gguf"), {}).ok());
  std::unique_ptr<gguf::Model> packed = open_or_die(dir.file("q3_packed.gguf"));
  ASSERT_TRUE(packed);
  const gguf::Value* types = packed->find(kKeyPackPartTypes);
  ASSERT_NE(types, nullptr);
  std::vector<Value> relabelled(types->array.size(), Value::of_uint(ValueType::kUint32, kIq3S));
  rewrite(*packed, dir.file("iq_packed.gguf"),
          [&](gguf::Writer& w) { w.set(kKeyPackPartTypes, Value::of_array(ValueType::kUint32, relabelled)); });
  std::unique_ptr<gguf::Model> iq_packed = open_or_die(dir.file("iq_packed.gguf"));
  ASSERT_TRUE(iq_packed);
  Result<ExpertLayout> layout = ExpertLayout::from_model(*iq_packed);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  models::Binder binder(*iq_packed);
  binder.expert_part(*layout, 0, Part::kGate, {kEmbd, kFf, kExperts});
  ASSERT_FALSE(binder.status().ok());
  EXPECT_NE(binder.status().message().find("has type IQ3_S, which Magnetar cannot compute with"), std::string::npos)
      << binder.status().message();
}

TEST(Pack, SplitSourceBecomesOneFile) {
  const std::string first = std::string(MAGNETAR_SHARED_DIR) + "/vectors/models/split-q4k-00001-of-00003.gguf";
  if (!std::filesystem::exists(first)) GTEST_SKIP() << "SKIP: split vectors not found at " << first;
  TempDir dir;
  std::unique_ptr<gguf::Model> src = open_or_die(first);
  ASSERT_GT(src->shards().size(), 1u);
  const Status s = pack(*src, dir.file("out.gguf"), {});
  ASSERT_TRUE(s.ok()) << s.message();
  std::unique_ptr<gguf::Model> out = open_or_die(dir.file("out.gguf"));
  ASSERT_TRUE(out);
  EXPECT_EQ(out->shards().size(), 1u);
  EXPECT_EQ(out->find("split.count"), nullptr);
  const Status v = verify(*out, *src, {});
  EXPECT_TRUE(v.ok()) << v.message();
}

}  // namespace
}  // namespace magnetar::experts
