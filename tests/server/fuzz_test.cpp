// A fuzz pass over the server's JSON endpoints: seeded random and mutated request bodies (byte flips,
// truncations, type swaps, extreme numbers, deep nesting, invalid UTF-8, random JSON) against every POST route.
// Each answer must be a well-formed HTTP response with status 200 or 4xx whose body is JSON (or an SSE stream for
// a body that turned out valid and asked to stream), never a 5xx or a dropped connection; afterwards the server
// still answers a valid request with the expected greedy text.
#include <random>

#include "tests/server/harness.h"

namespace magnetar::test {
namespace {

class ServerFuzz : public ServeFixture {
 protected:
  // A small context so that the longest valid prompts the fuzzer builds stay quick to prefill.
  static void SetUpTestSuite() { start_server({"--ctx", "128"}); }
};

const std::vector<std::pair<std::string, json>>& seeds() {
  static const std::vector<std::pair<std::string, json>> s = {
      {"/v1/chat/completions",
       {{"model", "m"}, {"max_tokens", 3}, {"temperature", 0.5}, {"stop", {"\n"}},
        {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}}}},
      {"/v1/chat/completions",
       {{"max_tokens", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
        {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hello"}}}}}}}}},
      {"/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 3}, {"top_k", 5}, {"seed", 7}}},
      {"/v1/messages",
       {{"model", "m"}, {"max_tokens", 3}, {"system", "Short."},
        {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}},
      {"/v1/messages",
       {{"max_tokens", 2}, {"stream", true},
        {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hey"}}}}}}}}},
      {"/v1/messages/count_tokens", {{"messages", {{{"role", "user"}, {"content", "count me"}}}}}},
      {"/tokenize", {{"content", "hello world"}}},
      {"/detokenize", {{"tokens", {1, 2, 3}}}},
  };
  return s;
}

// A random JSON value of bounded size.
json random_value(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth > 3 ? 6 : 8)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return int64_t(rng()) >> (rng() % 64);
    case 3: return std::ldexp(double(int64_t(rng() % 2001) - 1000), int(rng() % 80) - 40);
    case 4: {
      std::string s;
      for (size_t i = rng() % 12; i > 0; --i) s += char(32 + rng() % 95);
      return s;
    }
    case 5: return "";
    case 6: {
      json a = json::array();
      for (size_t i = rng() % 4; i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      static const char* keys[] = {"role", "content", "messages", "max_tokens", "stream", "type", "text", "tools",
                                   "stop", "temperature", "prompt", "tokens", "system", "x"};
      json o = json::object();
      for (size_t i = rng() % 4; i > 0; --i) o[keys[rng() % std::size(keys)]] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Replaces one value somewhere in `j` (walking a random path) with a random one.
void mutate_value(json& j, std::mt19937_64& rng) {
  json* at = &j;
  for (int step = 0; step < 6; ++step) {
    if (at->is_object() && !at->empty() && rng() % 3 != 0) {
      auto it = at->begin();
      std::advance(it, long(rng() % at->size()));
      at = &it.value();
    } else if (at->is_array() && !at->empty() && rng() % 3 != 0) {
      at = &(*at)[rng() % at->size()];
    } else {
      break;
    }
  }
  *at = random_value(rng, 0);
}

std::string mutate(const json& seed, std::mt19937_64& rng) {
  json j = seed;
  switch (rng() % 8) {
    case 0: {  // byte flips in the text
      std::string s = j.dump();
      for (int i = 0; i < 1 + int(rng() % 4); ++i) s[rng() % s.size()] = char(rng() % 256);
      return s;
    }
    case 1: {  // truncated
      const std::string s = j.dump();
      return s.substr(0, rng() % s.size());
    }
    case 2: {  // deep nesting
      std::string s(size_t(100 + rng() % 5000), '[');
      return "{\"messages\":" + s;
    }
    case 3: {  // invalid UTF-8 inside a string
      std::string s = j.dump();
      const size_t q = s.find("\":\"");
      if (q != std::string::npos) s.insert(q + 3, rng() % 2 ? "\xff\xfe" : "\xc3");
      return s;
    }
    case 4: return random_value(rng, 0).dump();
    case 5: {  // extreme numbers
      static const char* extremes[] = {"-1", "0", "1e400", "-1e400", "9223372036854775808", "1.5", "\"3\"", "null"};
      for (const char* key : {"max_tokens", "temperature", "top_k", "top_p", "seed", "n"}) {
        if (rng() % 3 == 0) j[key] = json::parse(extremes[rng() % std::size(extremes)], nullptr, false);
      }
      return j.dump();
    }
    default:
      for (int i = 0; i < 1 + int(rng() % 3); ++i) mutate_value(j, rng);
      return j.dump();
  }
}

TEST_F(ServerFuzz, MutatedBodiesNeverCrashOrGet5xx) {
  std::mt19937_64 rng(20261130);
  constexpr int kCases = 1500;
  int ok = 0, rejected = 0;
  httplib::Client c = client();
  c.set_read_timeout(120);  // a mutated body without max_tokens generates to the end of the context
  for (int i = 0; i < kCases; ++i) {
    const auto& [path, seed] = seeds()[rng() % seeds().size()];
    const std::string body = mutate(seed, rng);
    httplib::Result r = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r) << "case " << i << ": no response from " << path << " (error " << int(r.error()) << ") for body "
                   << body.substr(0, 300);
    ASSERT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500))
        << "case " << i << ": " << path << " answered " << r->status << " to " << body.substr(0, 300) << "\n"
        << r->body.substr(0, 300);
    const bool sse = r->get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
    if (!sse) {
      ASSERT_FALSE(json::parse(r->body, nullptr, false).is_discarded())
          << "case " << i << ": " << path << " answered non-JSON: " << r->body.substr(0, 300);
    }
    (r->status == 200 ? ok : rejected)++;
  }
  // Both outcomes occur (the mutations are neither all harmless nor all fatal).
  EXPECT_GT(ok, kCases / 20);
  EXPECT_GT(rejected, kCases / 4);
  // The server is still itself.
  int status = 0;
  const json answer = post("/v1/chat/completions",
                           {{"max_tokens", 8}, {"temperature", 0}, {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}},
                           &status);
  ASSERT_EQ(status, 200) << answer.dump();
  EXPECT_EQ(answer["choices"][0]["message"]["content"].get<std::string>().rfind("I am", 0), 0u) << answer.dump();
  std::printf("fuzz: %d cases, %d answered 200, %d rejected with 4xx\n", kCases, ok, rejected);
}

}  // namespace
}  // namespace magnetar::test
