#include "chat/tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/json_shape.h"

namespace magnetar::chat {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest proper prefix of `tag` that `text` ends with (bytes that may become the tag).
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Moves `end` back over whitespace.
size_t trim_back(std::string_view text, size_t end) {
  while (end > 0 && is_space(text[end - 1])) --end;
  return end;
}

class HermesParser final : public OutputParser {
 public:
  explicit HermesParser(const OutputFormat& format)
      : format_(format),
        state_(format.starts_in_reasoning ? State::kReasoningStart
                                          : (format.reasoning ? State::kStart : State::kText)) {}

  void feed(std::string_view text, std::vector<OutputEvent>* events) override {
    buf_ += text;
    process(false, events);
  }

  void finish(std::vector<OutputEvent>* events) override {
    process(true, events);
    // A body whose quotes do not pair (not JSON) hid its closing tag in a "string": the first tag seen there closes
    // it after all (as text), and what follows is parsed again.
    while (state_ == State::kToolCall && scan_.tag_in_string != std::string::npos) {
      close_call(scan_.tag_in_string, events);
      process(true, events);
    }
    if (state_ == State::kToolCall) {
      // Unclosed at the end: a call if the body is complete, else the original bytes as text.
      if (!emit_call(buf_, events)) emit(OutputEventKind::kText, separator_ + std::string(kCallOpen) + buf_, events);
      separator_.clear();
    }
    buf_.clear();
  }

 private:
  static constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
  static constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
  enum class State {
    kStart,           // reasoning enabled, nothing seen but whitespace: a think block may open
    kReasoningStart,  // inside the think block, before its first non-space byte
    kReasoning,
    kAfterReasoning,  // after </think>, before the answer's first non-space byte
    kText,
    kToolCall,  // inside <tool_call>: the body is buffered until </tool_call>
  };

  void emit(OutputEventKind kind, std::string text, std::vector<OutputEvent>* events) {
    if (text.empty()) return;
    if (kind == OutputEventKind::kText) after_call_ = false;
    events->push_back({kind, std::move(text)});
  }

  // Emits the tool call whose body is `body` (between the tags); false when it is not a valid call. Its arguments
  // (under "arguments", or Llama's "parameters") are an object, or a string holding one (some models encode them, as
  // the OpenAI API does), or absent from a body of the name alone (a call without arguments: {}); anything else is no
  // call (the bytes stay text: nothing is lost).
  bool emit_call(std::string_view body, std::vector<OutputEvent>* events) {
    if (!json_refusal(body).empty()) return false;
    const nlohmann::ordered_json call = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!call.is_object()) return false;
    auto name = call.find("name");
    if (name == call.end() || !name->is_string()) return false;
    auto given = call.find("arguments");
    if (given == call.end()) given = call.find("parameters");
    if (given == call.end() && call.size() != 1) return false;  // keys besides the name: arguments of another name
    nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
    if (given != call.end() && given->is_string()) {
      const std::string& text = given->get_ref<const std::string&>();
      if (!json_refusal(text).empty()) return false;
      arguments = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    } else if (given != call.end()) {
      arguments = *given;
    }
    if (!arguments.is_object()) return false;
    events->push_back({OutputEventKind::kToolCallBegin, name->get<std::string>()});
    events->push_back({OutputEventKind::kToolCallArguments, arguments.dump()});
    events->push_back({OutputEventKind::kToolCallEnd, {}});
    after_call_ = true;
    return true;
  }

  void skip_space() {
    size_t n = 0;
    while (n < buf_.size() && is_space(buf_[n])) ++n;
    buf_.erase(0, n);
  }

  void process(bool final, std::vector<OutputEvent>* events) {
    for (;;) {
      switch (state_) {
        case State::kStart:
          skip_space();
          if (buf_.empty()) return;
          if (buf_.starts_with(kThinkOpen)) {
            buf_.erase(0, kThinkOpen.size());
            state_ = State::kReasoningStart;
          } else if (!final && kThinkOpen.starts_with(buf_)) {
            return;
          } else {
            state_ = State::kText;
          }
          break;
        case State::kReasoningStart:
        case State::kAfterReasoning:
          skip_space();
          if (buf_.empty()) return;
          state_ = state_ == State::kReasoningStart ? State::kReasoning : State::kText;
          break;
        case State::kReasoning: {
          const size_t close = buf_.find(kThinkClose);
          if (close != std::string::npos) {
            emit(OutputEventKind::kReasoning, buf_.substr(0, trim_back(buf_, close)), events);
            buf_.erase(0, close + kThinkClose.size());
            state_ = State::kAfterReasoning;
            break;
          }
          const size_t end = trim_back(buf_, final ? buf_.size() : buf_.size() - partial_tag(buf_, kThinkClose));
          emit(OutputEventKind::kReasoning, buf_.substr(0, end), events);
          buf_.erase(0, final ? buf_.size() : end);
          return;
        }
        case State::kText: {
          const size_t open = format_.tool_calls ? buf_.find(kCallOpen) : std::string::npos;
          if (open != std::string::npos) {
            const size_t end = trim_back(buf_, open);
            emit(OutputEventKind::kText, buf_.substr(0, end), events);
            separator_ = buf_.substr(end, open - end);
            buf_.erase(0, open + kCallOpen.size());
            state_ = State::kToolCall;
            scan_ = {};
            break;
          }
          if (final) {
            // Whitespace after the last tool call only separated it; any other tail is answer text.
            if (!(after_call_ && trim_back(buf_, buf_.size()) == 0)) emit(OutputEventKind::kText, buf_, events);
            buf_.clear();
            return;
          }
          const size_t held = format_.tool_calls ? partial_tag(buf_, kCallOpen) : 0;
          const size_t end = trim_back(buf_, buf_.size() - held);
          emit(OutputEventKind::kText, buf_.substr(0, end), events);
          buf_.erase(0, end);
          return;
        }
        case State::kToolCall: {
          const size_t close = find_call_close();
          if (close == std::string::npos) return;  // finish() decides about an unclosed call
          close_call(close, events);
          break;
        }
      }
    }
  }

  // Ends the call whose closing tag is at `close`: a call when its body is one, else its bytes as text.
  void close_call(size_t close, std::vector<OutputEvent>* events) {
    const std::string_view body = std::string_view(buf_).substr(0, close);
    if (!emit_call(body, events)) {
      emit(OutputEventKind::kText, separator_ + std::string(kCallOpen) + std::string(body) + std::string(kCallClose),
           events);
    }
    separator_.clear();
    buf_.erase(0, close + kCallClose.size());
    state_ = State::kText;
  }

  // The body's </tool_call>: the first outside a JSON string (arguments may hold the tag as text: code or prompts
  // being edited). The scan resumes where the last call stopped, so a long call costs its length once; npos while
  // the tag has not arrived (a partial tag at the end waits for more bytes).
  size_t find_call_close() {
    // At buf_[at] ('<'): 1 the closing tag, -1 the start of one cut off by the end of buf_, 0 neither.
    auto tag_at = [this](size_t at) {
      const std::string_view rest = std::string_view(buf_).substr(at);
      return rest.starts_with(kCallClose) ? 1 : kCallClose.starts_with(rest) ? -1 : 0;
    };
    for (; scan_.at < buf_.size(); ++scan_.at) {
      const char c = buf_[scan_.at];
      if (scan_.in_string) {
        if (c == '<' && scan_.tag_in_string == std::string::npos) {
          const int tag = tag_at(scan_.at);
          if (tag < 0) return std::string::npos;
          if (tag > 0) scan_.tag_in_string = scan_.at;
        }
        if (scan_.escaped) {
          scan_.escaped = false;
        } else if (c == '\\') {
          scan_.escaped = true;
        } else if (c == '"') {
          scan_.in_string = false;
        }
      } else if (c == '"') {
        scan_.in_string = true;
      } else if (c == '<') {
        const int tag = tag_at(scan_.at);
        if (tag > 0) return scan_.at;
        if (tag < 0) return std::string::npos;
      }
    }
    return std::string::npos;
  }

  const OutputFormat format_;
  State state_;
  struct {
    size_t at = 0;  // kToolCall: bytes of buf_ scanned for the closing tag
    bool in_string = false, escaped = false;
    size_t tag_in_string = std::string::npos;  // the first closing tag seen inside a string
  } scan_;
  std::string buf_;          // bytes received and not yet emitted
  std::string separator_;    // kToolCall: the whitespace before <tool_call> (text again if the call is invalid)
  bool after_call_ = false;  // a tool call was the last thing emitted
};

}  // namespace

std::unique_ptr<OutputParser> new_hermes_parser(const OutputFormat& format) {
  return std::make_unique<HermesParser>(format);
}

std::vector<OutputEvent> merge_events(const std::vector<OutputEvent>& events) {
  std::vector<OutputEvent> out;
  for (const OutputEvent& e : events) {
    const bool mergeable = e.kind == OutputEventKind::kText || e.kind == OutputEventKind::kReasoning ||
                           e.kind == OutputEventKind::kToolCallArguments;
    if (mergeable && !out.empty() && out.back().kind == e.kind) {
      out.back().text += e.text;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

}  // namespace magnetar::chat
