// `magnetar serve` end to end, OpenAI chat routes (tests/server/harness.h starts the server).

#include <poll.h>

#include <chrono>
#include <thread>

#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

class Serve : public ServeFixture {
 protected:
  static json chat(json extra = json::object()) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"temperature", 0}};
    body.update(extra);
    int status = 0;
    json r = post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r;
  }
};

// OpenAI's sampling fields as OpenAI and vLLM define them: presence and frequency penalties count the tokens generated
// for the request only (over the prompt, "Who" "are" "you" and the template's tokens changed the first greedy token),
// logit_bias moves the argmax, top_k -1 is off, and seed 0 repeats its draws (it drew a random seed).
TEST_F(Serve, SamplingFieldsFollowOpenAI) {
  const json plain = chat({{"max_tokens", 1}});
  const std::string first = plain["choices"][0]["message"]["content"];
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(chat({{"max_tokens", 1}, {"presence_penalty", 2.0}})["choices"][0]["message"]["content"], first);
  EXPECT_EQ(chat({{"max_tokens", 1}, {"frequency_penalty", 2.0}})["choices"][0]["message"]["content"], first);
  EXPECT_EQ(chat({{"max_tokens", 1}, {"top_k", -1}})["choices"][0]["message"]["content"], first);
  const json ids = post("/tokenize", {{"content", first}, {"parse_special", false}})["tokens"];
  ASSERT_EQ(ids.size(), 1u) << ids.dump();
  const json banned = chat({{"max_tokens", 1}, {"logit_bias", {{std::to_string(ids[0].get<int>()), -100}}}});
  EXPECT_NE(banned["choices"][0]["message"]["content"], first) << banned.dump();
  const json hot = {{"temperature", 1.5}, {"top_k", 0}, {"top_p", 1}, {"min_p", 0}, {"seed", 0}, {"max_tokens", 24}};
  EXPECT_EQ(chat(hot)["choices"][0]["message"]["content"], chat(hot)["choices"][0]["message"]["content"]);
}

TEST_F(Serve, HealthModelsHead) {
  httplib::Client c = client();
  httplib::Result health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body), json({{"status", "ok"}}));
  httplib::Result models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "magnetar-demo-q8_0");
  EXPECT_EQ(m["data"][0]["owned_by"], "magnetar");
  httplib::Result head = c.Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
}

TEST_F(Serve, GreedyChatCompletion) {
  const json r = chat();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "magnetar-demo-q8_0");
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["finish_reason"], "stop");
  const std::string content = choice["message"]["content"];
  EXPECT_EQ(content.rfind(kAnswerStart, 0), 0u) << content;
  const json& usage = r["usage"];
  EXPECT_GT(usage["completion_tokens"].get<int>(), 3);
  EXPECT_EQ(usage["total_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  const json tokens = post("/tokenize", {{"content", kPrompt}});
  EXPECT_EQ(usage["prompt_tokens"].get<size_t>(), tokens["tokens"].size());
  // The answer round-trips through /tokenize and /detokenize.
  const json ids = post("/tokenize", {{"content", content}});
  EXPECT_EQ(post("/detokenize", {{"tokens", ids["tokens"]}})["content"], content);
}

TEST_F(Serve, SecondRequestReusesTheCache) {
  chat();
  const json r = chat();
  EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << r.dump();
  // The same prompt again after a one-token answer (the slot holds the prompt and its logits): all of it is cached
  // (it said 0).
  const json probe = {{"messages", {{{"role", "user"}, {"content", "Name a colour."}}}}, {"max_tokens", 1}};
  chat(probe);
  const json again = chat(probe);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], again["usage"]["prompt_tokens"]) << again.dump();
}

TEST_F(Serve, StreamMatchesNonStream) {
  const std::string want = chat()["choices"][0]["message"]["content"];
  int status = 0;
  const std::string body = raw_post("/v1/chat/completions",
                                    json({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                                          {"temperature", 0},
                                          {"stream", true},
                                          {"stream_options", {{"include_usage", true}}}})
                                        .dump(),
                                    &status);
  ASSERT_EQ(status, 200);
  std::vector<std::string> data;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos) << body;
    data.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  ASSERT_GE(data.size(), 4u) << body;
  EXPECT_EQ(data.back(), "[DONE]");
  std::string got, finish;
  bool first_has_role = false, saw_usage = false;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json chunk = json::parse(data[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage")) {
      saw_usage = true;
      EXPECT_GT(chunk["usage"]["completion_tokens"].get<int>(), 0);
      continue;
    }
    const json& choice = chunk["choices"][0];
    if (i == 0) first_has_role = choice["delta"].value("role", "") == "assistant";
    if (choice["delta"].contains("content")) got += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_TRUE(first_has_role);
  EXPECT_TRUE(saw_usage);
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(got, want);
}

TEST_F(Serve, MaxTokensAndStop) {
  const json r = chat({{"max_tokens", 3}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  const json s = chat({{"stop", {"language"}}});
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s["choices"][0]["message"]["content"], "I am a tiny ");
}

TEST_F(Serve, BadRequestsAre400AndNameTheField) {
  struct Case {
    std::string body, field;
  };
  const Case cases[] = {
      {"{not json", "JSON"},
      {R"({"model": "x"})", "messages"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})", "temperature"},
      {R"({"messages": [{"role": "user", "content": 7}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content is required"},
      {R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": null}]})",
       "messages[1].content is required"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "stop": 3})", "stop"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "temperature": -1})",
       "temperature must be a finite number >= 0"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5})", "top_p must be in [0, 1]"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "min_p": -1})", "min_p must be in [0, 1]"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_k": 4294967297})", "top_k must be"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_k": -2})", "top_k must be"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}})", "logit_bias: key 'x'"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}})", "[-100, 100]"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999999": 1}})", "outside the vocabulary"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": [1]})", "logit_bias must be an object"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1.1})",
       "repetition_penalty: not supported"},
      // Asked for and not done: refused, not answered without it.
      {R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})", "n must be 1"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true})", "logprobs: log probabilities"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]})",
       "functions: not supported"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "function_call": {"name": "f"}})", "function_call: not"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})", "max_tokens must be >= 1"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3})",
       "max_completion_tokens must be >= 1"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const json r = json::parse(raw_post("/v1/chat/completions", c.body, &status), nullptr, false);
    EXPECT_EQ(status, 400) << c.body;
    ASSERT_TRUE(r.is_object()) << c.body;
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << c.body;
    EXPECT_NE(r["error"]["message"].get<std::string>().find(c.field), std::string::npos) << r.dump();
  }
  // The same fields at their harmless values are accepted (clients send them).
  for (const char* body : {R"({"messages": [{"role": "user", "content": "hi"}], "n": 1, "logprobs": false,
                               "top_logprobs": 0, "functions": [], "function_call": "auto", "max_tokens": 2})",
                           R"({"messages": [{"role": "user", "content": "hi"}], "n": null, "logprobs": null,
                               "max_tokens": 2})"}) {
    int status = 0;
    raw_post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << body;
  }
  for (const char* body : {R"({"prompt": "hi", "echo": true})", R"({"prompt": "hi", "logprobs": 2})",
                           R"({"prompt": "hi", "suffix": "x"})", R"({"prompt": "hi", "best_of": 3})"}) {
    int status = 0;
    raw_post("/v1/completions", body, &status);
    EXPECT_EQ(status, 400) << body;
  }
  // A prompt longer than the context names both sizes.
  std::string longer;
  for (int i = 0; i < 5000; ++i) longer += "word ";
  int status = 0;
  const json r = json::parse(raw_post("/v1/chat/completions",
                                      json({{"messages", {{{"role", "user"}, {"content", longer}}}}}).dump(), &status));
  EXPECT_EQ(status, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("context"), std::string::npos) << r.dump();
  // One far beyond any context (8 MiB without a space) is refused by its size before it is tokenized (that took ~28
  // bytes of memory per byte).
  const json huge = json::parse(
      raw_post("/v1/chat/completions",
               json({{"messages", {{{"role", "user"}, {"content", std::string(8 << 20, 'a')}}}}}).dump(), &status));
  EXPECT_EQ(status, 400);
  EXPECT_NE(huge["error"]["message"].get<std::string>().find("more than the maximum context length of"),
            std::string::npos)
      << huge.dump().substr(0, 300);
  httplib::Client c = client();
  httplib::Result missing = c.Get("/v2/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
  httplib::Result health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(Serve, ClientDisconnectMidStream) {
  // A raw socket reads the first bytes of a stream and hangs up; the next request must still be served.
  const int fd = raw_connect();
  ASSERT_GE(fd, 0);
  const std::string body = json({{"messages", {{{"role", "user"}, {"content", "Tell me a long story about Linux."}}}},
                                 {"stream", true},
                                 {"max_tokens", 400},
                                 {"temperature", 1.0},
                                 {"seed", 7}})
                               .dump();
  const std::string request =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  std::string got;
  char buf[256];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  close(fd);
  const json r = chat({{"max_tokens", 3}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
}

// The tokens generated so far by the server (its /metrics counter).
double generated_total(httplib::Client& c) {
  httplib::Result r = c.Get("/metrics");
  if (!r) return -1;
  const std::string name = "\nmagnetar_generated_tokens_total ";
  const size_t at = r->body.find(name);
  return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size()));
}

TEST_F(Serve, ClientDisconnectCancelsANonStreamedRequest) {
  // A request whose greedy answer is long, sent once to the end: its completion_tokens is what a run to the end costs.
  const json ask = {{"messages", {{{"role", "user"}, {"content", "Explain Python in detail, with many examples."}}}},
                    {"temperature", 0},
                    {"max_tokens", 400}};
  httplib::Client c = client();
  double before = generated_total(c);
  const json full = post("/v1/chat/completions", ask);
  const int whole = full["usage"]["completion_tokens"].get<int>();
  ASSERT_GE(whole, 100) << "the control answer must be long for the test to mean anything: " << full.dump();
  EXPECT_EQ(generated_total(c) - before, double(whole));
  // The same request, non-streamed, from a client that hangs up right after sending it.
  before = generated_total(c);
  const int fd = raw_connect();
  ASSERT_GE(fd, 0);
  const std::string body = ask.dump();
  const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  usleep(20000);
  close(fd);
  // The job ends (cancelled) well before the whole answer: /metrics counts what it generated once it is done.
  double generated = -1;
  for (int i = 0; i < 200; ++i) {
    usleep(50000);
    httplib::Result m = c.Get("/metrics");
    ASSERT_TRUE(m);
    if (m->body.find("\nmagnetar_requests_active 0") != std::string::npos && generated_total(c) > before - 1) {
      generated = generated_total(c) - before;
      break;
    }
  }
  ASSERT_GE(generated, 0) << "the request never ended";
  // The demo model decodes ~1,000 tokens/s here: 20 ms before the hang-up plus up to 25 ms to notice it.
  EXPECT_LT(generated, 0.75 * double(whole)) << "a client that hung up still got (nearly) its whole answer computed";
  // The server serves the next request.
  EXPECT_EQ(chat({{"max_tokens", 3}})["usage"]["completion_tokens"], 3);
}

// Last (the tests run in declaration order): SIGTERM stops the server with exit status 0.
TEST_F(Serve, StopsCleanlyOnSigterm) {
  ASSERT_EQ(kill(server->pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(server->pid, &status, 0), server->pid);
  server->pid = -1;
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// SIGTERM while a long generation runs and another request waits in the queue: both requests end (the running one's
// stream is cut short, the queued one gets a 503 saying the server is stopping) and the process exits at once with
// status 0 (before, it waited for every running and queued generation to finish).
class ServeStop : public ServeFixture {
 protected:
  static void SetUpTestSuite() { start_server({"--ctx", "16384", "--parallel", "1", "--keepalive-seconds", "1"}); }
};

// A streamed request queued behind a long generation gets keep-alives while it waits (before, nothing was written
// until it started, so a client that left was not noticed either); its client leaving ends it.
TEST_F(ServeStop, AQueuedStreamGetsKeepAlives) {
  auto send = [&](int fd, const json& body) {
    const std::string b = body.dump();
    const std::string request =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        "application/json\r\nContent-Length: " +
        std::to_string(b.size()) + "\r\n\r\n" + b;
    return write(fd, request.data(), request.size()) == ssize_t(request.size());
  };
  const json ask = {{"messages", {{{"role", "user"}, {"content", "Tell me a long story."}}}},
                    {"ignore_eos", true},
                    {"temperature", 0}};
  const int running = raw_connect(), waiting = raw_connect();
  ASSERT_GE(running, 0);
  ASSERT_GE(waiting, 0);
  ASSERT_TRUE(send(running, ask));
  usleep(300000);
  json stream = ask;
  stream["stream"] = true;
  ASSERT_TRUE(send(waiting, stream));
  std::string got;
  const auto t0 = std::chrono::steady_clock::now();
  while (got.find(": keep-alive") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4)) {
    pollfd p{.fd = waiting, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 100) == 1) {
      char buf[512];
      const ssize_t n = read(waiting, buf, sizeof(buf));
      if (n <= 0) break;
      got.append(buf, size_t(n));
    }
  }
  EXPECT_NE(got.find(": keep-alive"), std::string::npos) << got;
  EXPECT_EQ(got.find("data: "), std::string::npos) << got;  // still queued: no content
  close(waiting);
  close(running);
  httplib::Client c = client();
  for (int i = 0; i < 100; ++i) {  // both end: the running one within 25 ms, the queued one at its next keep-alive
    httplib::Result m = c.Get("/metrics");
    ASSERT_TRUE(m);
    if (m->body.find("\nmagnetar_requests_active 0") != std::string::npos) break;
    usleep(50000);
  }
  json quick = ask;
  quick["max_tokens"] = 3;
  int status = 0;
  post("/v1/chat/completions", quick, &status);
  EXPECT_EQ(status, 200);
}

TEST_F(ServeStop, SigtermEndsRunningAndQueuedRequests) {
  const json ask = {{"messages", {{{"role", "user"}, {"content", "Tell me a long story."}}}},
                    {"ignore_eos", true},
                    {"temperature", 0},
                    {"stream", true}};
  int running_status = 0, queued_status = 0;
  std::string running, queued;
  std::thread first([&] { running = raw_post("/v1/chat/completions", ask.dump(), &running_status); });
  usleep(300000);  // the first is generating (16K tokens: tens of seconds)
  json plain = ask;
  plain.erase("stream");
  std::thread second([&] { queued = raw_post("/v1/chat/completions", plain.dump(), &queued_status); });
  usleep(200000);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server->pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(server->pid, &status, 0), server->pid);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  server->pid = -1;
  first.join();
  second.join();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LT(seconds, 5.0);
  // The running stream's connection closes with the server: a cut stream (no status) or its error event (200).
  EXPECT_TRUE(running_status == 0 || running_status == 200) << running_status;
  EXPECT_EQ(queued_status, 503) << queued;
  EXPECT_NE(queued.find("the server is stopping"), std::string::npos) << queued;
}

}  // namespace
}  // namespace magnetar
