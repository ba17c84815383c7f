// A Hugging Face model folder as the converter sees it: config.json and the weights, one
// model.safetensors or a sharded set (model-0000N-of-0000M.safetensors) listed by
// model.safetensors.index.json, presented as one tensor namespace.
//
// Every file name the index lists must be a plain name inside the folder (no '/' or '..'), every tensor the
// index maps must be in the shard it names, and no tensor may appear in two shards; violations are errors
// naming the index, the tensor and the shard.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "convert/json_util.h"
#include "convert/safetensors.h"

namespace magnetar::convert {

class HfModel {
 public:
  // Reads DIR/config.json and, when `with_weights`, maps the safetensors files (not needed for
  // --vocab-only). Fails naming the missing or malformed file.
  static Result<std::unique_ptr<HfModel>> open(const std::string& dir, bool with_weights);

  const std::string& dir() const { return dir_; }
  // config.json's top-level object; messages name "DIR/config.json".
  const JsonObject& config() const { return config_view_; }
  // config.json "architectures"[0], e.g. "Qwen3MoeForCausalLM"; empty when absent.
  const std::string& architecture() const { return architecture_; }

  // nullptr when the model has no tensor of that name.
  const SafeTensor* find_tensor(std::string_view name) const;
  // Every tensor of every shard, in shard order then data order.
  std::vector<const SafeTensor*> tensors() const;
  size_t n_tensors() const { return by_name_.size(); }

 private:
  HfModel() : config_view_(nullptr, "") {}
  Status open_weights();

  std::string dir_;
  Json config_;
  JsonObject config_view_;
  std::string architecture_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const SafeTensor*> by_name_;
};

}  // namespace magnetar::convert
