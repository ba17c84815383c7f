// `magnetar inspect MODEL.gguf`: what a GGUF file holds, without loading it (only the header is read; the
// tensor data stays unmapped pages). Works on single files and split sets (open the first shard).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "experts/layout.h"
#include "gguf/reader.h"
#include "quant/quant.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace magnetar::tools {
namespace {

std::string type_name_of(uint32_t type_id) {
  const quant::TypeSizeInfo* t = quant::find_type_size(type_id);
  return t ? std::string(t->name) : format("type%u", type_id);
}

double gib(uint64_t bytes) { return double(bytes) / double(1ull << 30); }

std::string human_bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return format("%.2f GiB", gib(bytes));
  if (bytes >= (1ull << 20)) return format("%.2f MiB", double(bytes) / double(1ull << 20));
  return format("%.2f KiB", double(bytes) / 1024.0);
}

std::string human_count(uint64_t n) {
  if (n >= 1000000000ull) return format("%.2f B", double(n) / 1e9);
  if (n >= 1000000ull) return format("%.2f M", double(n) / 1e6);
  if (n >= 1000ull) return format("%.2f K", double(n) / 1e3);
  return std::to_string(n);
}

nlohmann::json value_json(const gguf::Value& v) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::kBool: return v.u != 0;
    case ValueType::kUint8: case ValueType::kUint16: case ValueType::kUint32: case ValueType::kUint64: return v.u;
    case ValueType::kInt8: case ValueType::kInt16: case ValueType::kInt32: case ValueType::kInt64: return v.i;
    case ValueType::kFloat32: case ValueType::kFloat64: return v.f;
    case ValueType::kString: return v.str;
    case ValueType::kArray: {
      nlohmann::json a = nlohmann::json::array();
      for (const gguf::Value& item : v.array) a.push_back(value_json(item));
      return a;
    }
  }
  return nullptr;
}

// The expert layout of a packed file (experts/layout.h): one line of text and a JSON object. Standard files
// print nothing extra. A packed file whose layout does not validate is shown with the reason, not refused:
// inspect reads headers, it does not judge them.
struct PackedInfo {
  std::string line;
  nlohmann::json json;
  uint64_t expert_params = 0;  // weights in the records (their I8 shape counts bytes, not weights)
};

std::optional<PackedInfo> packed_info(const gguf::Model& model) {
  if (!model.find(experts::kKeyPackVersion)) return std::nullopt;
  Result<experts::ExpertLayout> layout = experts::ExpertLayout::from_model(model);
  if (!layout.ok()) {
    return PackedInfo{.line = "expert-major (packed), invalid: " + layout.status().message(),
                      .json = {{"layout", "expert-major"}, {"error", layout.status().message()}}};
  }
  nlohmann::json layers = nlohmann::json::array(), strides = nlohmann::json::array();
  uint64_t lo = UINT64_MAX, hi = 0, params = 0;
  for (int64_t l = 0; l < layout->n_layer(); ++l) {
    if (!layout->has_experts(l)) continue;
    for (int p = 0; p < experts::kParts; ++p) {
      const std::array<int64_t, 3>& ne = layout->part(l, experts::Part(p)).ne;
      params += uint64_t(ne[0]) * uint64_t(ne[1]) * uint64_t(ne[2]);
    }
    layers.push_back(l);
    strides.push_back(layout->record_stride(l));
    lo = std::min(lo, layout->record_stride(l));
    hi = std::max(hi, layout->record_stride(l));
  }
  const std::string stride = lo == hi ? format("%llu", (unsigned long long)lo)
                                      : format("%llu-%llu", (unsigned long long)lo, (unsigned long long)hi);
  return PackedInfo{
      .line = format("expert-major (packed v%u), %lld packed layers x %lld experts, record stride %s bytes",
                     experts::kPackVersion, (long long)layout->n_moe_layers(), (long long)layout->n_expert(),
                     stride.c_str()),
      .json = {{"layout", "expert-major"},
               {"version", experts::kPackVersion},
               {"n_expert", layout->n_expert()},
               {"packed_layers", layers},
               {"record_stride", strides}},
      .expert_params = params};
}

struct TypeTotal {
  uint64_t count = 0;
  uint64_t bytes = 0;
};

}  // namespace

int inspect_main(int argc, char** argv) {
  std::string path;
  bool show_kv = false, show_tensors = false, as_json = false, full_arrays = false;
  cli::Args args("magnetar inspect MODEL.gguf [--kv [--full]] [--tensors] [--json]",
                 "Shows what a GGUF model file holds: architecture, name, GGUF version, metadata and tensor counts,\n"
                 "file size, parameter count and a table of tensor types. Reads only the header. For a split model\n"
                 "(NAME-00001-of-0000N.gguf) give the first shard; the whole set is shown as one model.");
  args.positional("MODEL.gguf", &path, "the model file (first shard of a split set)");
  args.flag("--kv", &show_kv, "also list every metadata key with its type and value (long arrays abbreviated)");
  args.flag("--tensors", &show_tensors, "also list every tensor: name, type, shape, offset, bytes");
  args.flag("--json", &as_json, "print everything as one JSON object instead (all metadata, all tensors)");
  args.flag("--full", &full_arrays, "with --kv: print arrays whole instead of abbreviated");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "inspect")) return *code;
  if (full_arrays && !show_kv && !as_json) {
    std::fprintf(stderr, "magnetar inspect: --full applies to --kv (--json prints arrays whole)\n");
    return kExitBadInput;
  }

  Result<std::unique_ptr<gguf::Model>> opened = gguf::Model::open(path);
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar inspect: %s\n", opened.status().message().c_str());
    return kExitBadInput;
  }
  const gguf::Model& model = *opened.value();

  const std::optional<PackedInfo> packed = packed_info(model);
  const bool count_parts = packed && packed->expert_params > 0;
  uint64_t n_params = count_parts ? packed->expert_params : 0;
  std::map<std::string, TypeTotal> types;
  for (const gguf::TensorInfo& t : model.tensors()) {
    const bool layout_tensor = t.name == experts::kTableTensor || t.name.ends_with(".ffn_exps_packed");
    if (!(count_parts && layout_tensor)) n_params += uint64_t(t.n_elements());
    TypeTotal& total = types[type_name_of(t.type_id)];
    total.count += 1;
    total.bytes += t.nbytes;
  }

  if (as_json) {
    nlohmann::json j;
    j["file"] = path;
    j["shards"] = model.shards().size();
    j["architecture"] = model.architecture();
    j["name"] = model.get_string("general.name");
    j["gguf_version"] = model.version();
    j["n_kv"] = model.metadata().size();
    j["n_tensors"] = model.tensors().size();
    j["file_bytes"] = model.file_bytes();
    j["n_params"] = n_params;
    if (packed) j["expert_layout"] = packed->json;
    j["types"] = nlohmann::json::object();
    for (const auto& [name, total] : types) j["types"][name] = {{"count", total.count}, {"bytes", total.bytes}};
    j["metadata"] = nlohmann::json::object();
    for (const gguf::KeyValue& kv : model.metadata()) j["metadata"][kv.key] = value_json(kv.value);
    j["tensors"] = nlohmann::json::array();
    for (const gguf::TensorInfo& t : model.tensors()) {
      nlohmann::json shape = nlohmann::json::array();
      for (int d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
      j["tensors"].push_back({{"name", t.name}, {"type", type_name_of(t.type_id)}, {"shape", shape},
                              {"shard", t.shard}, {"offset", t.offset}, {"bytes", t.nbytes}});
    }
    // Metadata strings may hold arbitrary bytes: replace invalid UTF-8 rather than fail.
    std::printf("%s\n", j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return kExitOk;
  }

  std::printf("file:          %s", path.c_str());
  if (model.shards().size() > 1) std::printf(" (%zu shards)", model.shards().size());
  std::printf("\narchitecture:  %s\n", model.architecture().empty() ? "(none)" : model.architecture().c_str());
  const std::string name = model.get_string("general.name");
  if (!name.empty()) std::printf("name:          %s\n", name.c_str());
  std::printf("gguf version:  %u\n", model.version());
  std::printf("metadata:      %zu keys\n", model.metadata().size());
  std::printf("tensors:       %zu\n", model.tensors().size());
  std::printf("file size:     %llu bytes (%s)\n", (unsigned long long)model.file_bytes(),
              human_bytes(model.file_bytes()).c_str());
  std::printf("parameters:    %llu (%s)\n", (unsigned long long)n_params, human_count(n_params).c_str());
  if (packed) std::printf("layout:        %s\n", packed->line.c_str());
  std::printf("\n%-10s %8s %16s %10s\n", "type", "tensors", "bytes", "GiB");
  for (const auto& [tname, total] : types) {
    std::printf("%-10s %8llu %16llu %10.3f\n", tname.c_str(), (unsigned long long)total.count,
                (unsigned long long)total.bytes, gib(total.bytes));
  }

  if (show_kv) {
    std::printf("\n%-44s %-5s %s\n", "key", "type", "value");
    for (const gguf::KeyValue& kv : model.metadata()) {
      std::string type(gguf::value_type_name(kv.value.type));
      if (kv.value.type == gguf::ValueType::kArray) type += format("[%s]", gguf::value_type_name(kv.value.array_type).data());
      std::printf("%-44s %-5s %s\n", kv.key.c_str(), type.c_str(),
                  kv.value.to_string(full_arrays ? SIZE_MAX : 8).c_str());
    }
  }
  if (show_tensors) {
    std::printf("\n%-40s %-8s %-24s %6s %14s %14s\n", "tensor", "type", "shape", "shard", "offset", "bytes");
    for (const gguf::TensorInfo& t : model.tensors()) {
      std::printf("%-40s %-8s %-24s %6u %14llu %14llu\n", t.name.c_str(), type_name_of(t.type_id).c_str(),
                  t.shape_string().c_str(), t.shard, (unsigned long long)t.offset, (unsigned long long)t.nbytes);
    }
  }
  return kExitOk;
}

}  // namespace magnetar::tools
