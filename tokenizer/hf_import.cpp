// What llama.cpp's convert_hf_to_gguf.py writes for a byte-level BPE model (TextModel._set_vocab_gpt2 with
// get_vocab_base, then gguf-py's SpecialVocab), reproduced key by key so files converted by either tool
// carry the same tokenizer metadata:
//   tokens     model.vocab plus added_tokens by id, "[PAD{id}]" (UNUSED) up to n_vocab; vocab tokens NORMAL,
//              added tokens CONTROL when "special" or when they look special (<|...|>, <｜...｜>, <unused...>,
//              <pad>, <mask>, ...), else USER_DEFINED with U+2581 turned into spaces;
//   merges     "LEFT RIGHT", spaces inside a part written as U+0120 (the byte-level space);
//   special    SpecialVocab order: for bos, eos, unk, sep, pad, cls, mask the tokenizer_config.json
//              *_token (looked up among added_tokens), then config.json *_token_id for those still unset;
//   add flags  add_{bos,eos,sep}_token from a TemplateProcessing post-processor, then tokenizer_config.json;
//   template   tokenizer_config.json chat_template, else chat_template.jinja, else chat_template.json.
// Not reproduced: RobertaProcessing and the pair-template / EOT-EOM juggling of SpecialVocab (BERT-style and
// multi-EOS models, not byte-level BPE LLMs), and the Python converter's tokenizer-hash pre detection, for
// which the pre_tokenizer regex stands in.
#include "tokenizer/hf_import.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/unicode.h"

namespace magnetar::tokenizer {
namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // TokenType values

constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Reads and parses DIR/NAME; a missing optional file gives a null json.
Result<json> read_json(const std::string& dir, const std::string& name, bool required) {
  const std::string path = dir + "/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required) return json();
    return Status::error(path + ": cannot open (not an HF tokenizer folder?)");
  }
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path + ": not valid JSON");
  if (!j.is_object()) return Status::error(path + ": expected a JSON object");
  return j;
}

std::string read_text(const std::string& path, bool* found) {
  std::ifstream in(path, std::ios::binary);
  *found = bool(in);
  std::stringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// convert_hf_to_gguf.py's does_token_look_special.
bool looks_special(std::string_view t) {
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" ||
         (starts_with(t, "<|") && ends_with(t, "|>")) ||
         (starts_with(t, "<\xEF\xBD\x9C") && ends_with(t, "\xEF\xBD\x9C>")) ||  // <｜...｜> (deepseek-coder)
         (starts_with(t, "<unused") && ends_with(t, ">"));
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

// The steps of a pre-tokenizer or normalizer (`list`: "pretokenizers" or "normalizers"), Sequences flattened; a
// step that is not an object is kept as null.
void flatten(const json& step, const char* list, std::vector<json>* out) {
  if (step.is_object() && step.value("type", "") == "Sequence" && step.contains(list) && step[list].is_array()) {
    for (const json& s : step[list]) flatten(s, list, out);
  } else if (!step.is_null()) {
    out->push_back(step.is_object() ? step : json());
  }
}

// A *_token entry of tokenizer_config.json: a string or {"content": ...}; "" otherwise.
std::string token_content(const json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_object() && entry.contains("content") && entry["content"].is_string()) {
    return entry["content"].get<std::string>();
  }
  return "";
}

// Insertion-ordered map, as Python dicts are (assigning an existing key keeps its place).
template <typename T>
struct Ordered {
  std::vector<std::pair<std::string, T>> items;
  bool has(const std::string& k) const {
    for (const auto& [key, v] : items) {
      if (key == k) return true;
    }
    return false;
  }
  void set(const std::string& k, T v) {
    for (auto& [key, old] : items) {
      if (key == k) {
        old = v;
        return;
      }
    }
    items.emplace_back(k, v);
  }
};

Result<std::vector<gguf::KeyValue>> import(const std::string& dir, int64_t n_vocab) {
  const std::string tj_path = dir + "/tokenizer.json";
  Result<json> tj_read = read_json(dir, "tokenizer.json", true);
  if (!tj_read.ok()) return tj_read.status();
  const json& tj = *tj_read;
  const auto fail = [&](const std::string& field, const std::string& problem) {
    return Status::error(tj_path + ": " + field + ": " + problem);
  };

  const json& model = tj.contains("model") ? tj["model"] : json();
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return fail("model.type", "'" + (model.is_object() ? model.value("type", "") : "") + "' is not BPE");
  }
  if (model.value("byte_fallback", false)) return fail("model.byte_fallback", "true (SentencePiece-style BPE)");
  const json& decoder = tj.contains("decoder") ? tj["decoder"] : json();
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
    return fail("decoder.type", "not ByteLevel (not a byte-level BPE)");
  }
  // What the supported families use, and all Magnetar implements: one Split by a known regex (Isolated), then
  // ByteLevel with neither a prefix space nor its own regex. Anything else would tokenize differently.
  std::vector<json> steps;
  flatten(tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : json(), "pretokenizers", &steps);
  const bool shape = steps.size() == 2 && steps[0].value("type", "") == "Split" && steps[0].contains("pattern") &&
                     steps[0]["pattern"].is_object() && steps[0]["pattern"].contains("Regex") &&
                     steps[0]["pattern"]["Regex"].is_string() && steps[1].value("type", "") == "ByteLevel";
  if (!shape) return fail("pre_tokenizer", "not a Split by a regex then ByteLevel (as Qwen2/Qwen3 and Llama 3 have)");
  if (steps[0].value("behavior", "") != "Isolated" || steps[0].value("invert", false)) {
    return fail("pre_tokenizer", "the Split is not Isolated, or inverted");
  }
  if (steps[1].value("add_prefix_space", false) || steps[1].value("use_regex", true)) {
    return fail("pre_tokenizer", "ByteLevel with add_prefix_space or use_regex is not supported");
  }
  const std::string regex = steps[0]["pattern"]["Regex"].get<std::string>();
  std::string pre;
  if (regex == kQwen2Regex) {
    pre = "qwen2";
  } else if (regex == kLlama3Regex) {
    pre = "llama-bpe";
  } else {
    return fail("pre_tokenizer", "unsupported Split regex '" + regex + "' (known: Qwen2/Qwen3, Llama 3)");
  }
  // The normalizer and BPE options each family has (the GGUF's pre-tokenizer name implies them).
  std::vector<json> norms;
  flatten(tj.contains("normalizer") ? tj["normalizer"] : json(), "normalizers", &norms);
  const bool nfc = norms.size() == 1 && norms[0].value("type", "") == "NFC";
  if (pre == "qwen2" ? !nfc : !norms.empty()) {
    return fail("normalizer", pre == "qwen2" ? "not NFC, as the Qwen2 pre-tokenizer's tokenizers have"
                                             : "present; the Llama 3 pre-tokenizer's tokenizers have none");
  }
  if (model.value("ignore_merges", false) != (pre == "llama-bpe")) {
    return fail("model.ignore_merges", pre == "llama-bpe" ? "false; Llama 3's tokenizers have true"
                                                          : "true; the Qwen2 pre-tokenizer's tokenizers have false");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return fail(std::string("model.") + key, "not supported");
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
    return fail("model.dropout", "BPE dropout (random merges) is not supported");
  }

  // Ids: the model vocabulary and the added tokens.
  if (!model.contains("vocab") || !model["vocab"].is_object()) return fail("model.vocab", "missing");
  struct Added {
    std::string content;
    bool special;
  };
  std::map<int64_t, std::string> normal;
  std::map<int64_t, Added> added;
  int64_t max_id = -1;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) return fail("model.vocab", "bad id for '" + text + "'");
    normal[id.get<int64_t>()] = text;
    max_id = std::max(max_id, id.get<int64_t>());
  }
  const json& added_tokens = tj.contains("added_tokens") ? tj["added_tokens"] : json::array();
  for (const json& a : added_tokens) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string()) {
      return fail("added_tokens", "entry without an integer id and a string content");
    }
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0) return fail("added_tokens", "negative id");
    const std::string& content = a["content"].get_ref<const std::string&>();
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (a.value(flag, false)) return fail("added_tokens", "'" + content + "': " + flag + " is not supported");
    }
    if (nfc && a.value("normalized", false) && to_nfc(content) != content) {
      return fail("added_tokens", "'" + content + "': matched in normalized text, which changes it");
    }
    added[id] = Added{a["content"].get<std::string>(), a.value("special", false)};
    max_id = std::max(max_id, id);
  }
  const int64_t n = n_vocab > 0 ? n_vocab : max_id + 1;
  if (max_id >= n) {
    return Status::error(format("%s: token id %lld does not fit the model's vocab_size %lld", tj_path.c_str(),
                                (long long)max_id, (long long)n));
  }
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<Value> types(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    int32_t type = kUnused;
    std::string text = format("[PAD%lld]", (long long)id);
    if (const auto a = added.find(id); a != added.end()) {
      text = a->second.content;
      if (a->second.special || looks_special(text)) {
        type = kControl;
      } else {
        text = replace_all(text, "\xE2\x96\x81", " ");  // U+2581: pre-normalized user-defined spaces
        type = kUserDefined;
      }
    } else if (const auto v = normal.find(id); v != normal.end()) {
      text = v->second;
      type = kNormal;
    }
    tokens[size_t(id)] = std::move(text);
    types[size_t(id)] = Value::of_int(ValueType::kInt32, type);
  }

  // Merges.
  if (!model.contains("merges") || !model["merges"].is_array()) return fail("model.merges", "missing");
  std::vector<std::string> merges;
  merges.reserve(model["merges"].size());
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(replace_all(m[0].get<std::string>(), " ", "\xC4\xA0") + " " +
                       replace_all(m[1].get<std::string>(), " ", "\xC4\xA0"));
    } else {
      return fail("model.merges", format("entry %zu is neither \"A B\" nor [\"A\", \"B\"]", merges.size()));
    }
  }

  // Special tokens and add_* flags (SpecialVocab).
  static const char* const kTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  Ordered<int64_t> special_ids;
  Ordered<bool> add_flags;
  const auto set_special = [&](const std::string& typ, const json& id) {
    if (!id.is_number_integer()) return;
    const int64_t v = id.get<int64_t>();
    if (v >= 0 && v < n && !special_ids.has(typ)) special_ids.set(typ, v);
  };
  Result<json> tc_read = read_json(dir, "tokenizer_config.json", false);
  if (!tc_read.ok()) return tc_read.status();
  json tc = *tc_read;
  std::string chat_template;
  json chat_template_list;
  const bool have_tc = tc.is_object();
  std::string bos, eos, cls, sep;
  if (have_tc) {
    bos = token_content(tc.value("bos_token", json()));
    eos = token_content(tc.value("eos_token", json()));
    cls = token_content(tc.value("cls_token", json()));
    sep = token_content(tc.value("sep_token", json()));
    if (bos.empty() && !cls.empty()) tc["bos_token"] = bos = cls;
    if (eos.empty() && !sep.empty()) tc["eos_token"] = eos = sep;
  }
  const json& post = tj.contains("post_processor") ? tj["post_processor"] : json();
  const json processors = post.is_object() && post.contains("processors") ? post["processors"] : json::array({post});
  for (const json& p : processors) {
    if (!p.is_object() || p.value("type", "") != "TemplateProcessing" || !p.contains("single")) continue;
    const json& single = p["single"];
    if (!single.is_array() || single.size() < 2) continue;
    const auto special_of = [](const json& item) {
      return item.contains("SpecialToken") ? item["SpecialToken"].value("id", "") : std::string();
    };
    // Without a tokenizer_config.json the template's tokens are taken as BOS and EOS.
    if (const std::string first = special_of(single.front()); !first.empty()) {
      if (!have_tc) bos = first;
      add_flags.set("bos", first == bos || first == cls);
    }
    if (const std::string last = special_of(single.back()); !last.empty()) {
      if (!have_tc) eos = last;
      add_flags.set("eos", last == eos);
    }
  }
  if (have_tc) {
    bool found = false;
    const std::string jinja = read_text(dir + "/chat_template.jinja", &found);
    json alt = found ? json(jinja) : json();
    if (!found) {
      Result<json> ctj = read_json(dir, "chat_template.json", false);
      if (!ctj.ok()) return ctj.status();
      if (ctj->is_object() && ctj->contains("chat_template")) alt = (*ctj)["chat_template"];
    }
    const json tmpl = tc.contains("chat_template") ? tc["chat_template"] : alt;
    if (tmpl.is_string()) chat_template = tmpl.get<std::string>();
    if (tmpl.is_array()) chat_template_list = tmpl;
    for (const char* typ : kTypes) {
      const std::string t(typ);
      if (const json add = tc.value("add_" + t + "_token", json()); add.is_boolean()) add_flags.set(t, add.get<bool>());
      const std::string content = token_content(tc.value(t + "_token", json()));
      if (content.empty()) continue;
      for (const json& a : added_tokens) {
        if (a["content"].get<std::string>() == content) {
          set_special(t, a["id"]);
          break;
        }
      }
    }
  }
  Result<json> config_read = read_json(dir, "config.json", false);
  if (!config_read.ok()) return config_read.status();
  const json& config = *config_read;
  if (config.is_object()) {
    for (const char* typ : kTypes) {
      const std::string key = std::string(typ) + "_token_id";
      json id = config.value(key, json());
      if (id.is_null() && config.contains("text_config") && config["text_config"].is_object()) {
        id = config["text_config"].value(key, json());
      }
      set_special(typ, id);
    }
  }

  // Assemble, in the converter's key order.
  std::vector<gguf::KeyValue> kv;
  kv.push_back({"tokenizer.ggml.model", Value::of_string("gpt2")});
  kv.push_back({"tokenizer.ggml.pre", Value::of_string(pre)});
  kv.push_back({"tokenizer.ggml.tokens", Value::of_strings(tokens)});
  kv.push_back({"tokenizer.ggml.token_type", Value::of_array(ValueType::kInt32, std::move(types))});
  kv.push_back({"tokenizer.ggml.merges", Value::of_strings(merges)});
  static const std::map<std::string, std::string> kIdKeys = {
      {"bos", "bos_token_id"},     {"eos", "eos_token_id"}, {"unk", "unknown_token_id"}, {"sep", "seperator_token_id"},
      {"pad", "padding_token_id"}, {"cls", "cls_token_id"}, {"mask", "mask_token_id"}};
  for (const auto& [typ, id] : special_ids.items) {
    kv.push_back({"tokenizer.ggml." + kIdKeys.at(typ), Value::of_uint(ValueType::kUint32, uint64_t(id))});
  }
  for (const auto& [typ, value] : add_flags.items) {
    if (typ == "bos" || typ == "eos" || typ == "sep") {  // the types GGUFWriter has add_add_*_token for
      kv.push_back({"tokenizer.ggml.add_" + typ + "_token", Value::of_bool(value)});
    }
  }
  if (!chat_template.empty()) kv.push_back({"tokenizer.chat_template", Value::of_string(chat_template)});
  if (chat_template_list.is_array()) {
    std::vector<std::string> names;
    std::string default_template;
    bool has_default = false;
    for (const json& choice : chat_template_list) {
      if (!choice.is_object() || !choice.contains("template") || !choice["template"].is_string()) continue;
      std::string name = choice.value("name", "");
      for (char& c : name) {
        if (!std::isalnum(uint8_t(c))) c = '_';
      }
      if (name.empty()) continue;
      if (name == "default") {
        default_template = choice["template"].get<std::string>();
        has_default = true;
      } else {
        names.push_back(name);
        kv.push_back({"tokenizer.chat_template." + name, Value::of_string(choice["template"].get<std::string>())});
      }
    }
    if (!names.empty()) kv.push_back({"tokenizer.chat_templates", Value::of_strings(names)});
    if (has_default) kv.push_back({"tokenizer.chat_template", Value::of_string(default_template)});
  }
  return kv;
}

}  // namespace

Result<std::vector<gguf::KeyValue>> gguf_metadata_from_hf(const std::string& hf_dir, int64_t n_vocab) {
  // nlohmann::json throws on type mismatches the checks above did not foresee; no exception leaves here.
  try {
    return import(hf_dir, n_vocab);
  } catch (const std::exception& e) {
    return Status::error(hf_dir + "/tokenizer.json: unexpected structure: " + e.what());
  }
}

}  // namespace magnetar::tokenizer
