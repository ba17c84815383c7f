#include "convert/hf_model.h"

#include <filesystem>
#include <map>

namespace magnetar::convert {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<HfModel>> HfModel::open(const std::string& dir, bool with_weights) {
  std::unique_ptr<HfModel> model(new HfModel());
  model->dir_ = dir;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::error(format("%s: not a directory", dir.c_str()));
  const std::string config_path = dir + "/config.json";
  if (!std::filesystem::exists(config_path, ec)) return Status::error(format("%s: not found", config_path.c_str()));
  Result<Json> config = read_json_file(config_path, config_path);
  if (!config.ok()) return config.status();
  model->config_ = std::move(config).value();
  if (!model->config_.is_object()) return Status::error(format("%s: not a JSON object", config_path.c_str()));
  model->config_view_ = JsonObject(&model->config_, config_path);

  Result<std::vector<std::string>> archs = model->config_view_.string_array("architectures");
  if (!archs.ok()) return archs.status();
  if (!archs.value().empty()) model->architecture_ = archs.value()[0];

  if (with_weights) MAGNETAR_RETURN_IF_ERROR(model->open_weights());
  return model;
}

Status HfModel::open_weights() {
  std::error_code ec;
  const std::string index_path = dir_ + "/" + kIndexFile;
  // shard file name -> tensors the index says it holds (ordered so shards open in a stable order)
  std::map<std::string, std::vector<std::string>> shards;
  if (std::filesystem::exists(index_path, ec)) {
    Result<Json> index = read_json_file(index_path, index_path, /*max_depth=*/32, /*unique_keys=*/true);
    if (!index.ok()) return index.status();
    const Json& j = index.value();
    const auto map_it = j.is_object() ? j.find("weight_map") : j.end();
    if (!j.is_object() || map_it == j.end() || !map_it->is_object()) {
      return Status::error(format("%s: field 'weight_map' is missing or not an object", index_path.c_str()));
    }
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it.value().is_string() || !is_plain_file_name(it.value().get<std::string>())) {
        return Status::error(format("%s: weight_map '%s': not a file name inside the model folder", index_path.c_str(),
                                    it.key().c_str()));
      }
      shards[it.value().get<std::string>()].push_back(it.key());
    }
    if (shards.empty()) return Status::error(format("%s: weight_map is empty", index_path.c_str()));
  } else if (std::filesystem::exists(dir_ + "/" + kSingleFile, ec)) {
    shards[kSingleFile] = {};
  } else {
    return Status::error(format("%s: no %s or %s", dir_.c_str(), kSingleFile, kIndexFile));
  }

  for (const auto& [file_name, expected] : shards) {
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(dir_ + "/" + file_name);
    if (!file.ok()) return file.status();
    for (const std::string& name : expected) {
      if (!file.value()->find(name)) {
        return Status::error(format("%s: tensor '%s' is mapped to %s, which does not contain it", index_path.c_str(),
                                    name.c_str(), file_name.c_str()));
      }
    }
    for (const SafeTensor& t : file.value()->tensors()) {
      const auto [it, inserted] = by_name_.emplace(t.name, &t);
      if (!inserted) {
        return Status::error(format("%s: tensor '%s' is also in %s", (dir_ + "/" + file_name).c_str(), t.name.c_str(),
                                    std::string(it->second->file).c_str()));
      }
    }
    files_.push_back(std::move(file).value());
  }
  return Status();
}

const SafeTensor* HfModel::find_tensor(std::string_view name) const {
  const auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const SafeTensor*> HfModel::tensors() const {
  std::vector<const SafeTensor*> out;
  out.reserve(by_name_.size());
  for (const auto& f : files_) {
    for (const SafeTensor& t : f->tensors()) out.push_back(&t);
  }
  return out;
}

}  // namespace magnetar::convert
