#include "convert/convert.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "gguf/writer.h"
#include "quant/fp16.h"
#include "tokenizer/hf_import.h"

namespace magnetar::convert {
namespace {

using gguf::Value;
using gguf::ValueType;

constexpr uint64_t kChunkBytes = 64ull << 20;       // output bytes converted per round, split across threads
constexpr int64_t kMinElementsPerThread = 1 << 16;  // below this a thread costs more than it saves

struct OutTypeInfo {
  OutType type;
  std::string_view name;
  quant::Type quant_type;  // general.file_type is its quant::TypeTraits::file_type
};

constexpr OutTypeInfo kOutTypes[] = {
    {OutType::kF32, "f32", quant::Type::F32},
    {OutType::kF16, "f16", quant::Type::F16},
    {OutType::kBF16, "bf16", quant::Type::BF16},
    {OutType::kQ8_0, "q8_0", quant::Type::Q8_0},
};

const OutTypeInfo& info(OutType type) {
  for (const OutTypeInfo& t : kOutTypes) {
    if (t.type == type) return t;
  }
  MAGNETAR_CHECK(false);
  return kOutTypes[0];
}

// llama.cpp's prepare_tensors rules for the types convert_hf_to_gguf.py can write.
quant::Type output_type(const PlannedTensor& t, OutType out) {
  if (t.ne.size() <= 1 || t.kind == TensorKind::kKeepF32) return quant::Type::F32;
  const quant::Type q = info(out).quant_type;
  if (t.ne[0] % quant::traits(q).block_size != 0) return quant::Type::F16;
  return q;
}

// The model's name from its folder: the folder's own name, or for a Hugging Face cache snapshot
// (.../models--ORG--NAME/snapshots/COMMIT) NAME; "." and ".." name the folder they stand for.
std::string dir_name(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path path = std::filesystem::absolute(dir, ec).lexically_normal();  // a symlink keeps its name
  if (ec) path = std::filesystem::path(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  const std::filesystem::path parent = path.parent_path();
  const std::string repo = parent.parent_path().filename().string();
  if (parent.filename() == "snapshots" && repo.starts_with("models--")) {
    const size_t last = repo.rfind("--");
    if (last + 2 < repo.size()) return repo.substr(last + 2);
  }
  const std::string name = path.filename().string();
  return name.empty() ? dir : name;
}

// Dequantizes one source row of n elements into float32. Sources are F32, F16 or BF16 (checked when the
// plan was made); their bytes may be unaligned, hence the memcpy loads.
void row_to_float(Dtype dtype, const uint8_t* src, float* dst, int64_t n) {
  if (dtype == Dtype::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = dtype == Dtype::kF16 ? quant::fp16_to_float(h) : quant::bf16_to_float(h);
  }
}

bool same_encoding(Dtype dtype, quant::Type type) {
  return (dtype == Dtype::kF32 && type == quant::Type::F32) || (dtype == Dtype::kF16 && type == quant::Type::F16) ||
         (dtype == Dtype::kBF16 && type == quant::Type::BF16);
}

// Converts output rows [r0, r1) of `t` into `out` (which holds exactly those rows). Thread-safe: reads
// the mapped sources and writes only its own slice of `out`.
void convert_rows(const PlannedTensor& t, quant::Type type, int64_t r0, int64_t r1, uint8_t* out) {
  const quant::TypeTraits& tr = quant::traits(type);
  const int64_t n = t.row_length();
  const size_t row_bytes = quant::row_size(type, n);
  std::vector<float> row(static_cast<size_t>(n));
  size_t piece = 0;
  int64_t piece_start = 0;  // output row where sources[piece] begins
  for (int64_t r = r0; r < r1; ++r) {
    while (r >= piece_start + t.sources[piece].n_rows) piece_start += t.sources[piece++].n_rows;
    const SourceRows& s = t.sources[piece];
    const size_t esize = dtype_size(s.tensor->dtype);
    const uint8_t* src = s.tensor->data + size_t(s.row_begin + (r - piece_start)) * size_t(n) * esize;
    uint8_t* dst = out + size_t(r - r0) * row_bytes;
    if (same_encoding(s.tensor->dtype, type)) {
      std::memcpy(dst, src, row_bytes);  // bit-identical to llama.cpp's f16->f16 and bf16->bf16 paths
    } else {
      row_to_float(s.tensor->dtype, src, row.data(), n);
      tr.from_float(row.data(), dst, n);
    }
  }
}

// The plan's invariants, which the architecture functions guarantee: sources tile the output exactly.
void check_plan(const PlannedTensor& t) {
  MAGNETAR_CHECK(!t.ne.empty() && t.ne.size() <= size_t(gguf::kMaxDims));
  int64_t rows = 0;
  for (const SourceRows& s : t.sources) {
    MAGNETAR_CHECK(s.tensor != nullptr && s.n_rows >= 0 && s.row_begin >= 0);
    const int64_t row_len = s.tensor->shape.empty() ? 1 : s.tensor->shape.back();
    MAGNETAR_CHECK(row_len == t.row_length());
    MAGNETAR_CHECK((s.row_begin + s.n_rows) * row_len <= s.tensor->n_elements());
    rows += s.n_rows;
  }
  MAGNETAR_CHECK(rows == t.n_rows());
}

}  // namespace

std::optional<OutType> out_type_from_name(std::string_view name) {
  for (const OutTypeInfo& t : kOutTypes) {
    if (t.name.size() == name.size() && std::equal(name.begin(), name.end(), t.name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return t.type;
    }
  }
  return std::nullopt;
}

std::string_view out_type_name(OutType type) { return info(type).name; }

Result<std::unique_ptr<Conversion>> prepare(const Options& options) {
  auto conv = std::make_unique<Conversion>();
  MAGNETAR_ASSIGN_OR_RETURN(conv->model, HfModel::open(options.hf_dir, /*with_weights=*/!options.vocab_only));
  const HfModel& model = *conv->model;
  const std::string config_path = options.hf_dir + "/config.json";
  if (model.architecture().empty()) {
    return Status::error(format("%s: field 'architectures' is missing (supported: %s)", config_path.c_str(),
                                supported_architectures().c_str()));
  }
  const Architecture* arch = find_architecture(model.architecture());
  if (!arch) {
    return Status::error(format("%s: architecture '%s' is not supported (supported: %s)", config_path.c_str(),
                                model.architecture().c_str(), supported_architectures().c_str()));
  }
  MAGNETAR_ASSIGN_OR_RETURN(conv->plan, arch->plan(model, /*with_weights=*/!options.vocab_only));

  std::vector<gguf::KeyValue> tokenizer;
  std::error_code ec;
  conv->has_tokenizer = std::filesystem::exists(options.hf_dir + "/tokenizer.json", ec);
  if (options.vocab_only && !conv->has_tokenizer) {
    return Status::error(
        format("%s/tokenizer.json: not found (--vocab-only writes only the tokenizer)", options.hf_dir.c_str()));
  }
  if (conv->has_tokenizer) {
    MAGNETAR_ASSIGN_OR_RETURN(tokenizer, tokenizer::gguf_metadata_from_hf(options.hf_dir, conv->plan.n_vocab));
  }

  // llama.cpp's order: general.architecture, general.type/name, the hyperparameters, general.file_type,
  // general.quantization_version, then the tokenizer.
  std::vector<gguf::KeyValue>& md = conv->metadata;
  md.push_back({"general.architecture", Value::of_string(conv->plan.arch)});
  md.push_back({"general.type", Value::of_string("model")});
  md.push_back({"general.name", Value::of_string(dir_name(options.hf_dir))});
  md.insert(md.end(), conv->plan.metadata.begin(), conv->plan.metadata.end());
  const int32_t file_type = quant::traits(info(options.out_type).quant_type).file_type;
  md.push_back({"general.file_type", Value::of_uint(ValueType::kUint32, uint32_t(file_type))});
  md.push_back({"general.quantization_version", Value::of_uint(ValueType::kUint32, 2)});
  md.insert(md.end(), tokenizer.begin(), tokenizer.end());

  for (const PlannedTensor& t : conv->plan.tensors) {
    check_plan(t);
    const quant::Type type = output_type(t, options.out_type);
    conv->types.push_back(type);
    conv->data_bytes += quant::row_size(type, t.row_length()) * uint64_t(t.n_rows());
  }
  return conv;
}

Status write(const Conversion& conv, const Options& options) {
  gguf::Writer w(options.out_path);
  w.release_every(gguf::Writer::kReleaseBytes);  // the output's written pages leave the page cache as it goes
  for (const gguf::KeyValue& kv : conv.metadata) w.set(kv.key, kv.value);
  const std::vector<PlannedTensor>& tensors = conv.plan.tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MAGNETAR_RETURN_IF_ERROR(w.add_tensor(tensors[i].name, uint32_t(conv.types[i]), tensors[i].ne));
  }
  MAGNETAR_RETURN_IF_ERROR(w.begin());

  // The last output tensor that reads each source tensor, after which its pages are released.
  std::unordered_map<const SafeTensor*, size_t> last_use;
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (const SourceRows& s : tensors[i].sources) last_use[s.tensor] = i;
  }

  const int n_threads = std::max(1, options.n_threads);
  uint64_t done = 0;
  // F16 outputs: values beyond its range (+-65,504; BF16 and F32 checkpoints hold some) become infinite. Counted per
  // tensor and reported: a model with infinite weights computes NaN.
  auto count_infinite_halves = [](const std::vector<uint8_t>& bytes) {
    uint64_t n = 0;
    for (size_t i = 0; i + 1 < bytes.size(); i += 2) n += ((bytes[i] | (bytes[i + 1] << 8)) & 0x7fff) == 0x7c00;
    return n;
  };
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PlannedTensor& t = tensors[i];
    for (const SourceRows& s : t.sources) advise_will_need(*s.tensor);
    const quant::Type type = conv.types[i];
    const int64_t n_rows = t.n_rows();
    const size_t row_bytes = quant::row_size(type, t.row_length());
    const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(kChunkBytes / std::max<size_t>(1, row_bytes)));
    uint64_t infinite = 0;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(n_rows, r0 + rows_per_chunk);
      buffer.resize(size_t(r1 - r0) * row_bytes);
      const int64_t by_size = (r1 - r0) * t.row_length() / kMinElementsPerThread;
      const int64_t n_parts = std::clamp<int64_t>(by_size, 1, std::min<int64_t>(n_threads, r1 - r0));
      if (n_parts == 1) {
        convert_rows(t, type, r0, r1, buffer.data());
      } else {
        std::vector<std::thread> pool;
        for (int64_t k = 0; k < n_parts; ++k) {
          const int64_t a = r0 + (r1 - r0) * k / n_parts, b = r0 + (r1 - r0) * (k + 1) / n_parts;
          pool.emplace_back(convert_rows, std::cref(t), type, a, b, buffer.data() + size_t(a - r0) * row_bytes);
        }
        for (std::thread& th : pool) th.join();
      }
      if (type == quant::Type::F16) infinite += count_infinite_halves(buffer);
      MAGNETAR_RETURN_IF_ERROR(w.write(buffer));
      done += buffer.size();
      if (options.progress) options.progress(done, conv.data_bytes);
    }
    for (const SourceRows& s : t.sources) {
      if (last_use[s.tensor] == i) advise_done(*s.tensor);
    }
    if (infinite > 0) {
      std::fprintf(stderr,
                   "magnetar convert: warning: tensor '%s': %llu values are infinite in f16 (beyond +-65,504; "
                   "--outtype bf16 or f32 keeps them)\n",
                   t.name.c_str(), (unsigned long long)infinite);
    }
  }
  return w.finish();
}

Status convert(const Options& options) {
  MAGNETAR_ASSIGN_OR_RETURN(const std::unique_ptr<Conversion> conv, prepare(options));
  return write(*conv, options);
}

}  // namespace magnetar::convert
