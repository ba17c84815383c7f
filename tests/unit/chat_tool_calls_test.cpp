// chat/tool_calls.h, the Qwen3/Hermes output parser: expected events written out by hand, and the streaming
// property (any cut of the output into chunks gives the events of the whole, once adjacent pieces are merged).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/json_shape.h"
#include "chat/tool_calls.h"

namespace magnetar::chat {
namespace {

using K = OutputEventKind;

std::vector<OutputEvent> parse_chunks(const OutputFormat& format, const std::vector<std::string>& chunks) {
  std::unique_ptr<OutputParser> parser = new_hermes_parser(format);
  std::vector<OutputEvent> events;
  for (const std::string& c : chunks) parser->feed(c, &events);
  parser->finish(&events);
  return merge_events(events);
}

std::vector<OutputEvent> parse_whole(const OutputFormat& format, const std::string& text) {
  return parse_chunks(format, {text});
}

std::string show(const std::vector<OutputEvent>& events) {
  static const char* kNames[] = {"text", "reasoning", "call", "args", "end"};
  std::string out;
  for (const OutputEvent& e : events) out += std::string(kNames[int(e.kind)]) + "[" + e.text + "] ";
  return out;
}

// Every split into two chunks, and byte-by-byte feeding, give the events of the whole text.
void expect_cut_invariant(const OutputFormat& format, const std::string& text) {
  const std::vector<OutputEvent> whole = parse_whole(format, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ASSERT_EQ(parse_chunks(format, {text.substr(0, cut), text.substr(cut)}), whole)
        << "cut at " << cut << ": " << show(parse_chunks(format, {text.substr(0, cut), text.substr(cut)})) << " vs "
        << show(whole);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ASSERT_EQ(parse_chunks(format, bytes), whole) << show(parse_chunks(format, bytes));
  // Three-way cuts at every pair of positions (short texts only: quadratic).
  if (text.size() <= 160) {
    for (size_t a = 0; a <= text.size(); ++a) {
      for (size_t b = a; b <= text.size(); ++b) {
        ASSERT_EQ(parse_chunks(format, {text.substr(0, a), text.substr(a, b - a), text.substr(b)}), whole)
            << a << "," << b;
      }
    }
  }
}

const OutputFormat kTools{.tool_calls = true};
const OutputFormat kThinkingTools{.reasoning = true, .tool_calls = true};

const std::string kCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

TEST(HermesParser, PlainTextPassesThroughByteForByte) {
  const std::string text = "Hello, <b>world</b> <tool <think> \n\n";
  EXPECT_EQ(parse_whole({}, text), (std::vector<OutputEvent>{{K::kText, text}}));
  // Without tools, tool-call markup is text too.
  EXPECT_EQ(parse_whole({}, kCall), (std::vector<OutputEvent>{{K::kText, kCall}}));
  expect_cut_invariant({}, text);
  expect_cut_invariant(kTools, text);
}

TEST(HermesParser, OneToolCallAfterText) {
  const std::string text = "Let me check.\n" + kCall;
  const std::vector<OutputEvent> want = {{K::kText, "Let me check."},
                                         {K::kToolCallBegin, "get_weather"},
                                         {K::kToolCallArguments, R"({"city":"Paris"})"},
                                         {K::kToolCallEnd, ""}};
  EXPECT_EQ(parse_whole(kTools, text), want) << show(parse_whole(kTools, text));
  expect_cut_invariant(kTools, text);
}

TEST(HermesParser, SeveralToolCalls) {
  const std::string second =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"fmt\": [1, 2]}}\n</tool_call>";
  const std::string text = kCall + "\n" + second + "\n";
  const std::vector<OutputEvent> want = {{K::kToolCallBegin, "get_weather"},
                                         {K::kToolCallArguments, R"({"city":"Paris"})"},
                                         {K::kToolCallEnd, ""},
                                         {K::kToolCallBegin, "get_time"},
                                         {K::kToolCallArguments, R"({"tz":"CET","fmt":[1,2]})"},  // key order kept
                                         {K::kToolCallEnd, ""}};
  EXPECT_EQ(parse_whole(kTools, text), want) << show(parse_whole(kTools, text));
  expect_cut_invariant(kTools, text);
}

// An argument that holds the closing tag as text (a file being written that contains Hermes markup) does not close
// the call: the tag counts only outside JSON strings (an escaped quote does not end the string).
TEST(HermesParser, AClosingTagInsideAnArgumentStringIsText) {
  const std::string text =
      "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"content\": \"a \\\" </tool_call> "
      "b\"}}\n</tool_call>\nDone.";
  const std::vector<OutputEvent> want = {{K::kToolCallBegin, "write"},
                                         {K::kToolCallArguments, R"({"content":"a \" </tool_call> b"})"},
                                         {K::kToolCallEnd, ""},
                                         {K::kText, "\nDone."}};
  EXPECT_EQ(parse_whole(kTools, text), want) << show(parse_whole(kTools, text));
  expect_cut_invariant(kTools, text);
}

// A body whose quotes do not pair hides its closing tag in a "string": at the end of the output the first tag seen
// there closes it (as text, it is not JSON), and the call after it is still a call.
TEST(HermesParser, AnUnpairedQuoteDoesNotSwallowTheCallsAfterIt) {
  const std::string bad = "<tool_call>\n{\"name\": \"say\", \"arguments\": {\"t\": \"5\" tall\"}}\n</tool_call>";
  const std::string text = bad + "\n" + kCall;
  const std::vector<OutputEvent> want = {{K::kText, bad},
                                         {K::kToolCallBegin, "get_weather"},
                                         {K::kToolCallArguments, R"({"city":"Paris"})"},
                                         {K::kToolCallEnd, ""}};
  EXPECT_EQ(parse_whole(kTools, text), want) << show(parse_whole(kTools, text));
  expect_cut_invariant(kTools, text);
}

TEST(HermesParser, InvalidToolJsonIsTextWithTheOriginalBytes) {
  const std::string bad[] = {
      "<tool_call>\n{\"name\": \"x\", \"arguments\": {bad}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"x\", \"arguments\": \"[1]\"}\n</tool_call>",  // arguments must be an object
      "<tool_call>\n{\"name\": \"x\", \"arguments\": 5}\n</tool_call>",
      "<tool_call>\n{\"name\": \"x\", \"arguments\": \"{bad\"}\n</tool_call>",
      "<tool_call>\n{\"name\": \"x\", \"args\": {\"city\": \"Paris\"}}\n</tool_call>",  // not {}: arguments lost
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                 // no name
      "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
      "<tool_call>[1]</tool_call>",
      "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"s\": \"\xff\"}}\n</tool_call>",  // invalid UTF-8
  };
  for (const std::string& call : bad) {
    const std::string text = "Answer:\n " + call + " tail";
    EXPECT_EQ(parse_whole(kTools, text), (std::vector<OutputEvent>{{K::kText, text}}))
        << show(parse_whole(kTools, text));
    expect_cut_invariant(kTools, text);
  }
  // A bad call between good ones: the good ones stay calls, the bad one text (with the newline before it).
  const std::string text = kCall + "\n" + bad[0] + "\n" + kCall;
  const std::vector<OutputEvent> events = parse_whole(kTools, text);
  ASSERT_EQ(events.size(), 7u) << show(events);
  EXPECT_EQ(events[3], (OutputEvent{K::kText, "\n" + bad[0]}));
  expect_cut_invariant(kTools, text);
}

// A call without arguments has {} (vLLM's Hermes parser takes it too), and arguments given as a string holding a JSON
// object are that object (the OpenAI API's own encoding, which some models copy); both were text.
TEST(HermesParser, ArgumentsAbsentOrEncodedAsAStringAreACall) {
  const std::string none = "<tool_call>\n{\"name\": \"now\"}\n</tool_call>";
  EXPECT_EQ(
      parse_whole(kTools, none),
      (std::vector<OutputEvent>{{K::kToolCallBegin, "now"}, {K::kToolCallArguments, "{}"}, {K::kToolCallEnd, ""}}))
      << show(parse_whole(kTools, none));
  const std::string encoded =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>";
  EXPECT_EQ(parse_whole(kTools, encoded), (std::vector<OutputEvent>{{K::kToolCallBegin, "get_weather"},
                                                                    {K::kToolCallArguments, "{\"city\":\"Paris\"}"},
                                                                    {K::kToolCallEnd, ""}}))
      << show(parse_whole(kTools, encoded));
  expect_cut_invariant(kTools, "Checking. " + none + "\n" + encoded);
  // Llama's key for them
  const std::string llama = "<tool_call>\n{\"name\": \"f\", \"parameters\": {\"city\": \"Paris\"}}\n</tool_call>";
  EXPECT_EQ(parse_whole(kTools, llama),
            (std::vector<OutputEvent>{
                {K::kToolCallBegin, "f"}, {K::kToolCallArguments, "{\"city\":\"Paris\"}"}, {K::kToolCallEnd, ""}}))
      << show(parse_whole(kTools, llama));
}

// A call nested deeper than kMaxJsonNesting levels is text (its parse would be copied recursively); at the limit it
// is a call.
TEST(HermesParser, ACallNestedTooDeepIsText) {
  auto call = [](int arrays) {
    return "<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": " + std::string(size_t(arrays), '[') +
           std::string(size_t(arrays), ']') + "}}</tool_call>";
  };
  const std::string at_limit = call(kMaxJsonNesting - 2), deeper = call(kMaxJsonNesting - 1);
  EXPECT_EQ(json_shape(at_limit).nesting, kMaxJsonNesting);
  const std::vector<OutputEvent> events = parse_whole(kTools, at_limit);
  ASSERT_EQ(events.size(), 3u) << show(events);
  EXPECT_EQ(events[0], (OutputEvent{K::kToolCallBegin, "x"}));
  EXPECT_EQ(parse_whole(kTools, deeper), (std::vector<OutputEvent>{{K::kText, deeper}}));
}

TEST(HermesParser, ReasoningThenAnswer) {
  const std::string text = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!";
  const std::vector<OutputEvent> want = {{K::kReasoning, "The user greets me.\nI greet back."}, {K::kText, "Hello!"}};
  EXPECT_EQ(parse_whole(kThinkingTools, text), want) << show(parse_whole(kThinkingTools, text));
  expect_cut_invariant(kThinkingTools, text);
  // Leading whitespace before the think block; an empty think block gives no reasoning.
  EXPECT_EQ(parse_whole(kThinkingTools, "\n<think>\n\n</think>\n\nHi"), (std::vector<OutputEvent>{{K::kText, "Hi"}}));
  // Thinking on but no think block: all answer.
  EXPECT_EQ(parse_whole(kThinkingTools, "Just this."), (std::vector<OutputEvent>{{K::kText, "Just this."}}));
  // Thinking off: the tags are text.
  EXPECT_EQ(parse_whole(kTools, text), (std::vector<OutputEvent>{{K::kText, text}}));
}

TEST(HermesParser, ReasoningThenToolCall) {
  const std::string text = "<think>\nI need the weather. <tool_call> is how I call.\n</think>\n\n" + kCall;
  const std::vector<OutputEvent> want = {{K::kReasoning, "I need the weather. <tool_call> is how I call."},
                                         {K::kToolCallBegin, "get_weather"},
                                         {K::kToolCallArguments, R"({"city":"Paris"})"},
                                         {K::kToolCallEnd, ""}};
  EXPECT_EQ(parse_whole(kThinkingTools, text), want) << show(parse_whole(kThinkingTools, text));
  expect_cut_invariant(kThinkingTools, text);
}

TEST(HermesParser, OutputThatStartsInsideTheThinkBlock) {
  const OutputFormat format{.reasoning = true, .starts_in_reasoning = true, .tool_calls = true};
  const std::string text = "Thinking...\n</think>\n\nDone.";
  EXPECT_EQ(parse_whole(format, text), (std::vector<OutputEvent>{{K::kReasoning, "Thinking..."}, {K::kText, "Done."}}));
  // Cut off before </think>: all of it is reasoning.
  EXPECT_EQ(parse_whole(format, "Still thinking\n"), (std::vector<OutputEvent>{{K::kReasoning, "Still thinking"}}));
  expect_cut_invariant(format, text);
}

TEST(HermesParser, UnfinishedMarkupAtTheEnd) {
  // A call whose closing tag never came is accepted when its body is complete...
  const std::string unclosed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n";
  EXPECT_EQ(parse_whole(kTools, unclosed),
            (std::vector<OutputEvent>{{K::kToolCallBegin, "f"}, {K::kToolCallArguments, "{}"}, {K::kToolCallEnd, ""}}));
  // ...and text otherwise (a max_tokens cut inside the arguments).
  const std::string cut = "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ";
  EXPECT_EQ(parse_whole(kTools, cut), (std::vector<OutputEvent>{{K::kText, cut}}));
  // The start of a tag that never completed.
  EXPECT_EQ(parse_whole(kTools, "Hello <tool_ca"), (std::vector<OutputEvent>{{K::kText, "Hello <tool_ca"}}));
  EXPECT_EQ(parse_whole(kThinkingTools, "<thi"), (std::vector<OutputEvent>{{K::kText, "<thi"}}));
  expect_cut_invariant(kTools, unclosed);
  expect_cut_invariant(kTools, cut);
}

TEST(HermesParser, HoldsBackOnlyWhatCouldBeATag) {
  std::unique_ptr<OutputParser> parser = new_hermes_parser(kTools);
  std::vector<OutputEvent> events;
  parser->feed("The weather <tool", &events);
  EXPECT_EQ(events, (std::vector<OutputEvent>{{K::kText, "The weather"}}));  // " <tool" may start a call
  events.clear();
  parser->feed("s are great", &events);
  EXPECT_EQ(events, (std::vector<OutputEvent>{{K::kText, " <tools are great"}}));
}

}  // namespace
}  // namespace magnetar::chat
