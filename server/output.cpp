#include "server/output.h"

#include <algorithm>
#include <random>

#include "base/status.h"

namespace magnetar::server {

using json = nlohmann::ordered_json;

std::unique_ptr<chat::OutputParser> new_output_parser(const chat::OutputFormat& format) {
  return chat::new_hermes_parser(format);
}

std::vector<chat::OutputEvent> parse_output(const chat::OutputFormat& format, const std::string& text) {
  std::unique_ptr<chat::OutputParser> parser = new_output_parser(format);
  std::vector<chat::OutputEvent> events;
  parser->feed(text, &events);
  parser->finish(&events);
  return chat::merge_events(events);
}

std::string new_call_id(const char* prefix) {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

std::string thinking_signature(const std::string& thinking) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : thinking) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return format("magnetar%016llx", (unsigned long long)h);
}

const char* finish_reason_name(FinishReason f, bool tool_calls) {
  if (f == FinishReason::kLength) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

const char* anthropic_stop_reason(const Job& job, bool tool_use) {
  if (job.finish == FinishReason::kLength) return "max_tokens";
  if (!job.stop_sequence.empty()) return "stop_sequence";
  return tool_use ? "tool_use" : "end_turn";
}

json usage_json(const Job& job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
}

json anthropic_usage(const Job& job) {
  return {{"input_tokens", job.prompt_tokens - job.cached_tokens},
          {"output_tokens", job.completion_tokens},
          {"cache_read_input_tokens", job.cached_tokens}};
}

json responses_usage(const Job& job) {
  return {{"input_tokens", job.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", job.cached_tokens}}},
          {"output_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens}};
}

// ---- ResponsesOutput --------------------------------------------------------------------------------------------

void ResponsesOutput::on(const chat::OutputEvent& e) {
  switch (e.kind) {
    case chat::OutputEventKind::kReasoning:
      if (open_ != Kind::kReasoning) {
        open(Kind::kReasoning, {{"id", new_call_id("rs_")}, {"type", "reasoning"}, {"summary", json::array()}});
      }
      text_ += e.text;
      emit("response.reasoning_text.delta",
           {{"item_id", item_["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", e.text}});
      break;
    case chat::OutputEventKind::kText:
      if (open_ != Kind::kMessage) {
        open(Kind::kMessage, {{"id", new_call_id("msg_")},
                              {"type", "message"},
                              {"role", "assistant"},
                              {"status", "in_progress"},
                              {"content", json::array()}});
        emit("response.content_part.added",
             {{"item_id", item_["id"]}, {"output_index", index()}, {"content_index", 0}, {"part", text_part("")}});
      }
      text_ += e.text;
      emit("response.output_text.delta", {{"item_id", item_["id"]},
                                          {"output_index", index()},
                                          {"content_index", 0},
                                          {"delta", e.text},
                                          {"logprobs", json::array()}});
      break;
    case chat::OutputEventKind::kToolCallBegin: {
      const bool freeform = std::find(freeform_.begin(), freeform_.end(), e.text) != freeform_.end();
      json item = {{"id", new_call_id(freeform ? "ctc_" : "fc_")},
                   {"type", freeform ? "custom_tool_call" : "function_call"},
                   {"status", "in_progress"},
                   {"call_id", new_call_id("call_")},
                   {"name", e.text}};
      item[freeform ? "input" : "arguments"] = "";
      open(freeform ? Kind::kCustomCall : Kind::kCall, std::move(item));
      break;
    }
    case chat::OutputEventKind::kToolCallArguments:
      text_ += e.text;
      if (open_ == Kind::kCall) {
        emit("response.function_call_arguments.delta",
             {{"item_id", item_["id"]}, {"output_index", index()}, {"delta", e.text}});
      }
      break;
    case chat::OutputEventKind::kToolCallEnd: close(); break;
  }
}

void ResponsesOutput::close() {
  auto at = [&](json fields) {  // the open item's id and index, and `fields`
    fields["item_id"] = item_.value("id", json());
    fields["output_index"] = index();
    return fields;
  };
  switch (open_) {
    case Kind::kNone: return;
    case Kind::kReasoning:
      emit("response.reasoning_text.done", at({{"content_index", 0}, {"text", text_}}));
      item_["content"] = json::array({{{"type", "reasoning_text"}, {"text", text_}}});
      break;
    case Kind::kMessage:
      emit("response.output_text.done", at({{"content_index", 0}, {"text", text_}}));
      emit("response.content_part.done", at({{"content_index", 0}, {"part", text_part(text_)}}));
      item_["content"] = json::array({text_part(text_)});
      break;
    case Kind::kCall:
      emit("response.function_call_arguments.done", at({{"arguments", text_}}));
      item_["arguments"] = text_;
      break;
    case Kind::kCustomCall: {
      // The function's {"input": TEXT}; anything else the model wrote goes as it is.
      const json args = json::parse(text_, nullptr, false);
      item_["input"] =
          args.is_object() && args.value("input", json()).is_string() ? args["input"].get<std::string>() : text_;
      emit("response.custom_tool_call_input.done", at({{"input", item_["input"]}}));
      break;
    }
  }
  if (item_.contains("status")) item_["status"] = "completed";
  emit("response.output_item.done", {{"output_index", index()}, {"item", item_}});
  output_.push_back(std::move(item_));
  item_ = json();
  text_.clear();
  open_ = Kind::kNone;
}

void ResponsesOutput::emit(const char* type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  events_.emplace_back(type, std::move(fields));
}

json ResponsesOutput::text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

void ResponsesOutput::open(Kind kind, json item) {
  close();
  open_ = kind;
  item_ = std::move(item);
  emit("response.output_item.added", {{"output_index", index()}, {"item", item_}});
}

}  // namespace magnetar::server
