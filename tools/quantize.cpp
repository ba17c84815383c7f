// `magnetar quantize IN.gguf -o OUT.gguf --type T`: an F32/F16/BF16 GGUF (what `convert` writes) to any weight
// type quant/ implements, with the scalar reference quantizers (quant/ref, bit-exact with llama.cpp's).
//
// Policy, as llama.cpp's llama-quantize with --pure: 1-D tensors (norms, biases) and MoE routers
// (*ffn_gate_inp.weight) are copied unchanged; every other tensor gets --type, or the type of the first
// --map REGEX=TYPE whose regex matches its name (llama-quantize's --tensor-type lets the last match win; here
// the first does, so a specific map is written before a general one). Rows that do not fill whole blocks of
// the chosen type fall back as llama.cpp's llama_tensor_get_type does (Q2_K/Q3_K/IQ4_XS -> IQ4_NL,
// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16); types llama.cpp has no fallback for (it stops with
// "Unsupported tensor size") go to F16, as convert_hf_to_gguf.py does for q8_0. A tensor already of its target
// type is copied; one of another quantized type is refused unless --allow-requantize (then dequantized first).
//
// Everything is decided and checked before the output is created; the output is written through gguf::Writer
// (OUT.tmp, renamed at the end), so a failure never leaves a partial OUT. Rows are independent and each is
// quantized by one thread into its own slice of the chunk buffer, so the file is byte-identical for any -t.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "quant/quant.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace magnetar::tools {
namespace {

constexpr uint64_t kChunkBytes = 64ull << 20;       // source bytes converted per round, split across threads
constexpr int64_t kMinElementsPerThread = 1 << 16;  // below this a thread costs more than it saves (convert's)
constexpr size_t kMaxFallbacksListed = 16;          // the summary names this many fallbacks, then counts the rest

// ---- policy: which type each tensor gets -----------------------------------------------------------------

struct TypeMap {
  std::string pattern;
  std::regex regex;
  quant::Type type;
};

// What happens to one tensor.
struct Job {
  const gguf::TensorInfo* src = nullptr;
  uint32_t out_type = 0;                     // ggml id; a copied tensor keeps its own (maybe unimplemented) type
  bool copy = false;                         // bytes copied unchanged
  std::optional<quant::Type> fallback_from;  // the type asked for, when its blocks did not fit the rows
};

// Dimensions ignoring trailing 1s (ggml_n_dims): a [4096, 1] tensor is 1-D.
int effective_dims(const gguf::TensorInfo& t) {
  int n = 1;
  for (int d = 1; d < gguf::kMaxDims; ++d) {
    if (t.ne[d] > 1) n = d + 1;
  }
  return n;
}

// What llama-quantize leaves as it is (llama.cpp's tensor_allows_quantization, --pure or not): 1-D tensors (norms,
// biases), names not ending in "weight", norms stored 2-D, MoE routers, BERT's position and token-type embeddings,
// Mamba's and RWKV's small 2-D weights, T5's relative position bias and multimodal position embeddings. The engine
// binds norms and routers as F32.
bool keeps_type(const gguf::TensorInfo& t) {
  const std::string& name = t.name;
  if (effective_dims(t) < 2 || !name.ends_with("weight")) return true;
  if (name == "position_embd.weight" || name == "token_types.weight") return true;
  static constexpr const char* kKept[] = {"_norm.weight",
                                          "ffn_gate_inp.weight",
                                          "ssm_conv1d.weight",
                                          "shortconv.conv.weight",
                                          "time_mix_first.weight",
                                          "time_mix_w0.weight",
                                          "time_mix_w1.weight",
                                          "time_mix_w2.weight",
                                          "time_mix_v0.weight",
                                          "time_mix_v1.weight",
                                          "time_mix_v2.weight",
                                          "time_mix_a0.weight",
                                          "time_mix_a1.weight",
                                          "time_mix_a2.weight",
                                          "time_mix_g1.weight",
                                          "time_mix_g2.weight",
                                          "time_mix_decay_w1.weight",
                                          "time_mix_decay_w2.weight",
                                          "time_mix_lerp_fused.weight",
                                          "attn_rel_b.weight",
                                          ".position_embd."};
  for (const char* part : kKept) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

// What --type and --map apply to (the rest is copied): weights of two or more dimensions, routers excepted, with
// elements (a [0, N] tensor is copied as it is).
bool quantizable(const gguf::TensorInfo& t) { return !keeps_type(t) && t.n_elements() > 0; }

bool fits(quant::Type type, int64_t row_length) { return row_length % quant::traits(type).block_size == 0; }

// llama.cpp's llama_tensor_get_type fallback for rows of `row_length` elements that `wanted` cannot hold.
quant::Type with_fallback(quant::Type wanted, int64_t row_length) {
  using quant::Type;
  if (fits(wanted, row_length)) return wanted;
  Type alt = Type::F16;
  switch (wanted) {
    case Type::Q2_K:
    case Type::Q3_K:
    case Type::IQ4_XS: alt = Type::IQ4_NL; break;
    case Type::Q4_K: alt = Type::Q5_0; break;
    case Type::Q5_K: alt = Type::Q5_1; break;
    case Type::Q6_K: alt = Type::Q8_0; break;
    default: break;
  }
  return fits(alt, row_length) ? alt : Type::F16;
}

// "REGEX=TYPE" (split at the last '=', so the regex may hold one).
Result<TypeMap> parse_map(const std::string& spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return Status::error(format("--map '%s': expected REGEX=TYPE", spec.c_str()));
  }
  const std::string pattern = spec.substr(0, eq), type_name = spec.substr(eq + 1);
  const std::optional<quant::Type> type = quant::type_from_name(type_name);
  if (!type || !quant::is_weight_type(*type)) {
    return Status::error(format("--map '%s': '%s' is not a weight type (see --help)", spec.c_str(), type_name.c_str()));
  }
  try {  // std::regex reports a bad pattern only by throwing; it stays inside this function
    return TypeMap{.pattern = pattern, .regex = std::regex(pattern, std::regex::ECMAScript), .type = *type};
  } catch (const std::regex_error& e) {
    return Status::error(format("--map '%s': bad regular expression: %s", spec.c_str(), e.what()));
  }
}

// The job of every tensor, or the first reason the input cannot be quantized as asked.
Result<std::vector<Job>> plan(const gguf::Model& model, quant::Type main_type, const std::vector<TypeMap>& maps,
                              bool allow_requantize) {
  std::vector<Job> jobs;
  for (const gguf::TensorInfo& t : model.tensors()) {
    Job job{.src = &t, .out_type = t.type_id, .copy = true, .fallback_from = std::nullopt};
    if (quantizable(t)) {
      quant::Type wanted = main_type;
      for (const TypeMap& m : maps) {
        if (std::regex_search(t.name, m.regex)) {
          wanted = m.type;
          break;
        }
      }
      const quant::Type type = with_fallback(wanted, t.ne[0]);
      if (type != wanted) job.fallback_from = wanted;
      job.out_type = uint32_t(type);
      job.copy = job.out_type == t.type_id;
    }
    if (!job.copy) {
      const quant::TypeTraits* in = quant::find_traits(t.type_id);
      const quant::TypeSizeInfo* size = quant::find_type_size(t.type_id);
      const char* in_name = size ? size->name.data() : "unknown";
      if (!in) {
        return Status::error(format("%s: tensor '%s' is %s, which Magnetar cannot dequantize",
                                    model.shards()[0]->path().c_str(), t.name.c_str(), in_name));
      }
      if (in->is_quantized && !allow_requantize) {
        return Status::error(
            format("%s: tensor '%s' is already %s (requantizing loses accuracy; "
                   "--allow-requantize to do it anyway)",
                   model.shards()[0]->path().c_str(), t.name.c_str(), in_name));
      }
    }
    jobs.push_back(job);
  }
  return jobs;
}

// ---- writing ----------------------------------------------------------------------------------------------

// Rows [r0, r1) of `src` converted to `out` into `dst` (which holds exactly those rows). Thread-safe: reads the
// mapped source, writes only its own slice.
void convert_rows(const gguf::TensorInfo& src, quant::Type out, int64_t r0, int64_t r1, uint8_t* dst) {
  const quant::TypeTraits& in = quant::traits(quant::Type(src.type_id));
  const quant::TypeTraits& to = quant::traits(out);
  const int64_t n = src.ne[0];
  const size_t in_row = quant::row_size(in.type, n), out_row = quant::row_size(out, n);
  std::vector<float> row(static_cast<size_t>(n));  // [n] one row in float32
  for (int64_t r = r0; r < r1; ++r) {
    in.to_float(src.data + size_t(r) * in_row, row.data(), n);
    to.from_float(row.data(), dst + size_t(r - r0) * out_row, n);
  }
}

// The output's metadata: the input's, in order, without the split keys (the output is one file), with
// general.quantization_version and general.file_type set as llama-quantize sets them.
void copy_metadata(const gguf::Model& model, quant::Type main_type, gguf::Writer& w) {
  for (const gguf::KeyValue& kv : model.metadata()) {
    if (kv.key == "split.no" || kv.key == "split.count" || kv.key == "split.tensors.count") continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(uint32_t(*kv.value.as_uint()));  // the reader checked it is a u32 power of two
      continue;
    }
    w.set(kv.key, kv.value);
  }
  w.set("general.quantization_version", gguf::Value::of_uint(gguf::ValueType::kUint32, 2));  // GGML_QNT_VERSION
  w.set("general.file_type",
        gguf::Value::of_uint(gguf::ValueType::kUint32, uint32_t(quant::traits(main_type).file_type)));
}

// Streams every tensor's output bytes into `w` (after begin()); `progress` gets the source bytes done.
Status write_tensors(const std::vector<Job>& jobs, int n_threads, gguf::Writer& w, Progress& progress) {
  uint64_t done = 0;
  std::vector<uint8_t> buffer;
  for (const Job& job : jobs) {
    const gguf::TensorInfo& t = *job.src;
    if (job.copy) {
      for (uint64_t at = 0; at < t.nbytes; at += kChunkBytes) {
        const uint64_t n = std::min<uint64_t>(kChunkBytes, t.nbytes - at);
        MAGNETAR_RETURN_IF_ERROR(w.write({t.data + at, size_t(n)}));
        progress.update(done += n);
      }
      continue;
    }
    const quant::Type out = quant::Type(job.out_type);
    const int64_t n = t.ne[0], n_rows = t.n_elements() / n;
    const size_t in_row = quant::row_size(quant::Type(t.type_id), n), out_row = quant::row_size(out, n);
    const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(kChunkBytes / in_row));
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(n_rows, r0 + rows_per_chunk);
      buffer.resize(size_t(r1 - r0) * out_row);
      const int64_t by_size = (r1 - r0) * n / kMinElementsPerThread;
      const int64_t n_parts = std::clamp<int64_t>(by_size, 1, std::min<int64_t>(n_threads, r1 - r0));
      std::vector<std::thread> pool;
      for (int64_t k = 1; k < n_parts; ++k) {
        const int64_t a = r0 + (r1 - r0) * k / n_parts, b = r0 + (r1 - r0) * (k + 1) / n_parts;
        pool.emplace_back(convert_rows, std::cref(t), out, a, b, buffer.data() + size_t(a - r0) * out_row);
      }
      convert_rows(t, out, r0, r0 + (r1 - r0) / n_parts, buffer.data());  // part 0 on this thread
      for (std::thread& th : pool) th.join();
      MAGNETAR_RETURN_IF_ERROR(w.write(buffer));
      progress.update(done += size_t(r1 - r0) * in_row);
    }
  }
  return Status();
}

std::string type_name_of(uint32_t id) {
  const quant::TypeSizeInfo* s = quant::find_type_size(id);
  return s ? std::string(s->name) : format("type %u", id);
}

void print_summary(const std::vector<Job>& jobs, const gguf::Model& model, const std::string& out_path,
                   quant::Type main_type, double seconds) {
  struct Totals {
    int64_t count = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Totals> by_type;
  uint64_t in_bytes = 0, out_bytes = 0, n_weights = 0;
  std::vector<const Job*> fallbacks;
  for (const Job& job : jobs) {
    std::string problem;
    const uint64_t nbytes = *gguf::tensor_nbytes(job.out_type, job.src->ne, &problem);
    Totals& tt = by_type[type_name_of(job.out_type)];
    tt.count += 1;
    tt.bytes += nbytes;
    in_bytes += job.src->nbytes;
    out_bytes += nbytes;
    n_weights += uint64_t(job.src->n_elements());
    if (job.fallback_from) fallbacks.push_back(&job);
  }
  const double mib = 1024.0 * 1024.0, weights = double(std::max<uint64_t>(1, n_weights));
  std::printf("quantized %s -> %s (%s, %zu tensors)\n", model.shards()[0]->path().c_str(), out_path.c_str(),
              std::string(quant::type_name(main_type)).c_str(), jobs.size());
  for (const auto& [name, tt] : by_type) {
    std::printf("type %-7s %5lld tensors %12llu bytes (%.2f MiB)\n", name.c_str(), (long long)tt.count,
                (unsigned long long)tt.bytes, double(tt.bytes) / mib);
  }
  std::printf("size %.2f MiB -> %.2f MiB (%.3f -> %.3f bits per weight)\n", double(in_bytes) / mib,
              double(out_bytes) / mib, 8.0 * double(in_bytes) / weights, 8.0 * double(out_bytes) / weights);
  std::printf("fallbacks %zu\n", fallbacks.size());
  for (size_t i = 0; i < fallbacks.size() && i < kMaxFallbacksListed; ++i) {
    const Job& job = *fallbacks[i];
    std::printf("fallback %s: rows of %lld, %s -> %s\n", job.src->name.c_str(), (long long)job.src->ne[0],
                std::string(quant::type_name(*job.fallback_from)).c_str(), type_name_of(job.out_type).c_str());
  }
  if (fallbacks.size() > kMaxFallbacksListed) {
    std::printf("fallback ... and %zu more\n", fallbacks.size() - kMaxFallbacksListed);
  }
  std::printf("time %.2f s\n", seconds);
}

}  // namespace

int quantize_main(int argc, char** argv) {
  std::string in_path, out_path, type_name;
  std::vector<std::string> map_specs;
  bool allow_requantize = false;
  int64_t threads = int64_t(std::max(1u, std::thread::hardware_concurrency()));
  std::string types;
  for (const quant::TypeTraits& t : quant::all_types()) {
    if (!quant::is_weight_type(t.type)) continue;
    std::string name(t.name);
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    types += (types.empty() ? "" : " ") + name;
  }
  cli::Args args(
      "magnetar quantize IN.gguf -o OUT.gguf --type TYPE [--map REGEX=TYPE ...] [--allow-requantize] [-t N]",
      "Quantizes an F32/F16/BF16 GGUF (e.g. from `magnetar convert`) with the reference quantizers, which are\n"
      "bit-exact with llama.cpp's. Like llama-quantize --pure: 1-D tensors (norms, biases) and MoE routers\n"
      "(ffn_gate_inp) are copied unchanged, every other tensor gets --type or its first matching --map.\n"
      "Rows that do not fill whole blocks fall back as llama.cpp does (Q2_K/Q3_K/IQ4_XS -> IQ4_NL,\n"
      "Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, otherwise F16); the summary names them. Metadata is kept;\n"
      "general.file_type and general.quantization_version are set. Output is byte-identical for any -t.\n"
      "Types: " +
          types + ".");
  args.positional("IN.gguf", &in_path, "the model to quantize (first shard of a split set)");
  args.option("-o", &out_path, "OUT.gguf", "output file (written atomically)");
  args.option("--type", &type_name, "TYPE", "type of the weight matrices (see Types above)");
  args.option("--map", &map_specs, "REGEX=TYPE",
              "repeatable: tensors whose name contains a match of REGEX (ECMAScript)\n"
              "                           get TYPE; the first matching --map wins (e.g. --map _exps=q4_k\n"
              "                           --map token_embd=q8_0); norms and routers are never changed");
  args.flag("--allow-requantize", &allow_requantize, "accept quantized input tensors (dequantized, then quantized)");
  args.option("-t", &threads, "N", "threads");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "quantize")) return *code;

  const std::optional<quant::Type> main_type = quant::type_from_name(type_name);
  std::string error;
  if (type_name.empty())
    error = "--type TYPE is required (see --help)";
  else if (!main_type || !quant::is_weight_type(*main_type))
    error = format("--type '%s' is not one of: %s", type_name.c_str(), types.c_str());
  else if (out_path.empty())
    error = "-o OUT.gguf is required";
  else if (threads < 1)
    error = "-t must be >= 1";
  std::vector<TypeMap> maps;
  for (const std::string& spec : map_specs) {
    if (!error.empty()) break;
    Result<TypeMap> m = parse_map(spec);
    if (m.ok())
      maps.push_back(std::move(m).value());
    else
      error = m.status().message();
  }
  if (!error.empty()) {
    std::fprintf(stderr, "magnetar quantize: %s\n", error.c_str());
    return kExitBadInput;
  }

  Result<std::unique_ptr<gguf::Model>> opened = gguf::Model::open(in_path);
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar quantize: %s\n", opened.status().message().c_str());
    return kExitBadInput;
  }
  const gguf::Model& model = *opened.value();
  if (model.find("magnetar.pack.version") != nullptr) {  // experts/layout.h's kKeyPackVersion
    std::fprintf(stderr,
                 "magnetar quantize: %s: a packed file (magnetar pack): quantize the model it was packed from, "
                 "then pack the result\n",
                 in_path.c_str());
    return kExitBadInput;
  }
  if (model.has_file(out_path)) {
    std::fprintf(stderr, "magnetar quantize: -o %s: is the input: -o names the new file\n", out_path.c_str());
    return kExitBadInput;
  }
  Result<std::vector<Job>> planned = plan(model, *main_type, maps, allow_requantize);
  if (!planned.ok()) {
    std::fprintf(stderr, "magnetar quantize: %s\n", planned.status().message().c_str());
    return kExitBadInput;
  }
  const std::vector<Job>& jobs = planned.value();
  // A --map that quantizes nothing is most likely a mistyped pattern: say so (the run goes on).
  for (const TypeMap& m : maps) {
    const bool used = std::any_of(model.tensors().begin(), model.tensors().end(), [&](const gguf::TensorInfo& t) {
      return quantizable(t) && std::regex_search(t.name, m.regex);
    });
    if (!used) {
      std::fprintf(stderr, "magnetar quantize: warning: --map '%s=%s' matches no quantized tensor\n", m.pattern.c_str(),
                   std::string(quant::type_name(m.type)).c_str());
    }
  }

  gguf::Writer w(out_path);
  copy_metadata(model, *main_type, w);
  uint64_t in_bytes = 0;
  Status s;
  for (const Job& job : jobs) {
    in_bytes += job.src->nbytes;
    if (s.ok()) s = w.add_tensor(job.src->name, job.out_type, {job.src->ne.data(), size_t(job.src->n_dims)});
  }
  Progress progress("quantize " + out_path, in_bytes);
  if (s.ok()) s = w.begin();
  if (s.ok()) s = write_tensors(jobs, int(std::min<int64_t>(threads, 1024)), w, progress);
  if (s.ok()) s = w.finish();
  if (!s.ok()) {
    std::fprintf(stderr, "magnetar quantize: %s\n", s.message().c_str());
    return kExitFailure;
  }
  progress.finish(format("%.2f GiB read", double(in_bytes) / double(1ull << 30)));
  print_summary(jobs, model, out_path, *main_type, progress.seconds());
  return kExitOk;
}

}  // namespace magnetar::tools
