// `magnetar serve`'s security and limits (issue 7): --api-key (Bearer and x-api-key, 401 in both APIs' shapes), the
// Host allowlist against DNS rebinding (403), --max-body-mb (413) and --cors (tests/server/harness.h starts the
// server with each suite's flags).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cstdio>
#include <fstream>

#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

constexpr const char* kKey = "sekrit-key-42";

json who_are_you() {
  return {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"temperature", 0}, {"max_tokens", 16}};
}

json anthropic_who_are_you() {
  return {{"model", "m"}, {"max_tokens", 16}, {"temperature", 0}, {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}};
}

// ---- --api-key ----------------------------------------------------------------------------------------------------

class SecurityKey : public ServeFixture {
 protected:
  static void SetUpTestSuite() { start_server({"--api-key", kKey}); }
  static httplib::Result post_with(const std::string& path, const json& body, const httplib::Headers& headers) {
    httplib::Client c = client();
    return c.Post(path.c_str(), headers, body.dump(), "application/json");
  }
};

TEST_F(SecurityKey, MissingKeyIsRefusedInOpenAIShape) {
  httplib::Result r = post_with("/v1/chat/completions", who_are_you(), {});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["error"]["type"], "authentication_error") << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("API key"), std::string::npos) << r->body;
}

TEST_F(SecurityKey, MissingKeyIsRefusedInAnthropicShape) {
  httplib::Result r = post_with("/v1/messages", anthropic_who_are_you(), {});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["type"], "error") << r->body;
  EXPECT_EQ(j["error"]["type"], "authentication_error") << r->body;
}

TEST_F(SecurityKey, WrongKeyIsRefused) {
  for (const httplib::Headers& h : {httplib::Headers{{"Authorization", "Bearer wrong"}},
                                    httplib::Headers{{"x-api-key", "sekrit-key-4"}},
                                    httplib::Headers{{"Authorization", std::string("Basic ") + kKey}}}) {
    httplib::Result r = post_with("/v1/chat/completions", who_are_you(), h);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << h.begin()->first << ": " << h.begin()->second;
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  }
  httplib::Client c = client();
  httplib::Result models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
}

TEST_F(SecurityKey, BearerAndXApiKeyBothAnswer) {
  httplib::Result bearer = post_with("/v1/chat/completions", who_are_you(), {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(bearer);
  ASSERT_EQ(bearer->status, 200) << bearer->body;
  const std::string text = json::parse(bearer->body)["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_EQ(text.rfind(kAnswerStart, 0), 0u) << text;

  httplib::Result xkey = post_with("/v1/messages", anthropic_who_are_you(), {{"x-api-key", kKey}});
  ASSERT_TRUE(xkey);
  ASSERT_EQ(xkey->status, 200) << xkey->body;
  EXPECT_EQ(json::parse(xkey->body)["content"][0]["text"].get<std::string>().rfind(kAnswerStart, 0), 0u)
      << xkey->body;
}

TEST_F(SecurityKey, PublicRoutesNeedNoKey) {
  httplib::Client c = client();
  for (const char* path : {"/health", "/", "/webui/app.js"}) {
    httplib::Result r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
  }
  httplib::Result head = c.Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  httplib::Result status = c.Get("/v1/status");  // the UI's data is not public
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 401);
}

// A refused POST is answered at once, with Connection: close; the server goes on answering.
TEST_F(SecurityKey, RefusedPostIsAnsweredAtOnce) {
  const std::string body = who_are_you().dump();
  const std::string refused = raw_exchange(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(refused.rfind("HTTP/1.1 401", 0), 0u) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  const std::string health = raw_exchange("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_NE(health.find(R"({"status":"ok"})"), std::string::npos) << health;
}

TEST_F(SecurityKey, MetricsCountRefusals) {
  post_with("/v1/chat/completions", who_are_you(), {});
  httplib::Client c = client();
  httplib::Result m = c.Get("/metrics", {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("magnetar_requests_total{endpoint=\"/v1/chat/completions\",status=\"401\"}"),
            std::string::npos)
      << m->body;
}

// --api-key-file: the key from a file's first line (trailing whitespace dropped), not on the command line.
class SecurityKeyFile : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    path_ = ::testing::TempDir() + "magnetar_key_" + std::to_string(getpid());
    std::ofstream(path_) << "from-a-file \r\nsecond line\n";
    start_server({"--api-key-file", path_});
  }
  static void TearDownTestSuite() {
    ServeFixture::TearDownTestSuite();
    std::remove(path_.c_str());
  }
  inline static std::string path_;
};

TEST_F(SecurityKeyFile, TheFilesFirstLineIsTheKey) {
  httplib::Client c = client();
  httplib::Result none = c.Get("/v1/models");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  httplib::Result keyed = c.Get("/v1/models", {{"Authorization", "Bearer from-a-file"}});
  ASSERT_TRUE(keyed);
  EXPECT_EQ(keyed->status, 200) << keyed->body;
}

// ---- defaults: Host allowlist on loopback, no CORS --------------------------------------------------------------

class SecurityDefault : public ServeFixture {};

TEST_F(SecurityDefault, ForeignHostIsRefusedNamingIt) {
  httplib::Client c = client();
  httplib::Result r = c.Get("/v1/models", {{"Host", "evil.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["error"]["type"], "permission_error") << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("evil.example"), std::string::npos) << r->body;
  // The Anthropic route answers in its own shape; the page itself is not served to a foreign Host either.
  httplib::Result messages =
      c.Post("/v1/messages", {{"Host", "evil.example:8080"}}, anthropic_who_are_you().dump(), "application/json");
  ASSERT_TRUE(messages);
  EXPECT_EQ(messages->status, 403);
  EXPECT_EQ(json::parse(messages->body)["type"], "error");
  httplib::Result page = c.Get("/", {{"Host", "evil.example"}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 403);
}

TEST_F(SecurityDefault, LoopbackHostsAreAllowed) {
  const std::string port = std::to_string(server->port);
  for (const std::string& host : {"localhost:" + port, "127.0.0.1:" + port, std::string("LOCALHOST"), "[::1]:" + port}) {
    httplib::Client c = client();
    httplib::Result r = c.Get("/v1/models", {{"Host", host}});
    ASSERT_TRUE(r) << host;
    EXPECT_EQ(r->status, 200) << host << ": " << r->body;
  }
}

// A web page of another origin cannot use the server without --cors (a form's text/plain POST needs no preflight:
// any page the user visited could make it generate); its own web UI (the same origin) and clients that send no
// Origin (SDKs, curl) can.
TEST_F(SecurityDefault, OtherOriginsAreRefusedWithoutCors) {
  httplib::Client c = client();
  httplib::Result r = c.Get("/v1/models", {{"Origin", "http://app.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_NE(
      json::parse(r->body)["error"]["message"].get<std::string>().find("origin \"http://app.example\" is refused"),
      std::string::npos)
      << r->body;
  for (const auto& [name, value] : r->headers) {
    EXPECT_FALSE(name.starts_with("Access-Control-")) << name << ": " << value;
  }
  httplib::Result form =
      c.Post("/v1/completions", {{"Origin", "null"}}, R"({"prompt": "hi", "max_tokens": 1})", "text/plain");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 403);
  const std::string self = "127.0.0.1:" + std::to_string(server->port);
  httplib::Result own =
      c.Post("/tokenize", {{"Origin", "http://" + self}, {"Host", self}}, R"({"content": "hi"})", "application/json");
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200) << own->body;
}

// Bodies httplib would read without bound (chunked, compressed) or leave on the connection (a GET's) are refused
// before they are read, the connection closed.
TEST_F(SecurityDefault, UnboundedOrStrayBodiesAreRefused) {
  const std::string head = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string chunked = raw_exchange(head + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n0\r\n\r\n");
  EXPECT_EQ(chunked.rfind("HTTP/1.1 400", 0), 0u) << chunked;
  EXPECT_NE(chunked.find("send the body with a Content-Length"), std::string::npos) << chunked;
  const std::string gzip = raw_exchange(head + "Content-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd");
  EXPECT_EQ(gzip.rfind("HTTP/1.1 400", 0), 0u) << gzip;
  EXPECT_NE(gzip.find("send the body uncompressed"), std::string::npos) << gzip;
  const std::string no_length = raw_exchange(head + "\r\n");
  EXPECT_EQ(no_length.rfind("HTTP/1.1 400", 0), 0u) << no_length;
  const std::string get_body =
      raw_exchange("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(get_body.rfind("HTTP/1.1 400", 0), 0u) << get_body;
  EXPECT_NE(get_body.find("Connection: close"), std::string::npos) << get_body;
}

// curl -d sends application/x-www-form-urlencoded, which httplib caps at 8 KiB: the 413 says to send JSON (it named
// the 64 MiB limit the body was far below).
TEST_F(SecurityDefault, AFormEncodedBodyOver8KiBIsToldToBeJson) {
  httplib::Client c = client();
  const std::string body = R"({"tokens": [], "pad": ")" + std::string(9000, 'x') + "\"}";
  httplib::Result r = c.Post("/detokenize", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("send it as Content-Type: application/json"), std::string::npos) << r->body;
  httplib::Result small = c.Post("/detokenize", R"({"tokens": []})", "application/x-www-form-urlencoded");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
}

TEST_F(SecurityDefault, BodyUnderTheDefaultLimitIsRead) {
  int status = 0;
  const std::string body = R"({"tokens": [], "pad": ")" + std::string(2 << 20, 'x') + "\"}";
  const std::string r = raw_post("/detokenize", body, &status);
  EXPECT_EQ(status, 200) << r.substr(0, 200);
}

// ---- --allowed-hosts, --max-body-mb, --cors -----------------------------------------------------------------------

class SecurityFlags : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    start_server({"--allowed-hosts", "evil.example,Other.Example,fe80::1", "--max-body-mb", "1", "--cors",
                  "http://app.example"});
  }
  // A /detokenize body of exactly `bytes` bytes (its padding ignored by the route).
  static std::string body_of(size_t bytes) {
    const std::string head = R"({"tokens": [], "pad": ")", tail = "\"}";
    return head + std::string(bytes - head.size() - tail.size(), 'x') + tail;
  }
};

TEST_F(SecurityFlags, AllowedHostsAreAnswered) {
  for (const char* host : {"evil.example", "other.example:1234", "localhost", "[fe80::1]:8080"}) {
    httplib::Client c = client();
    httplib::Result r = c.Get("/v1/models", {{"Host", host}});
    ASSERT_TRUE(r) << host;
    EXPECT_EQ(r->status, 200) << host;
  }
  httplib::Client c = client();
  for (const char* host : {"third.example", "fe80:8080"}) {  // fe80::1 once allowed the name "fe80"
    httplib::Result r = c.Get("/v1/models", {{"Host", host}});
    ASSERT_TRUE(r) << host;
    EXPECT_EQ(r->status, 403) << host;
  }
}

TEST_F(SecurityFlags, OversizedBodyGets413NamingTheLimit) {
  int status = 0;
  const std::string r = raw_post("/detokenize", body_of((1 << 20) + 1), &status);
  EXPECT_EQ(status, 413);
  const json j = json::parse(r, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("1 MiB"), std::string::npos) << r;

  const std::string anthropic = raw_post("/v1/messages", body_of((1 << 20) + 1), &status);
  EXPECT_EQ(status, 413);
  EXPECT_EQ(json::parse(anthropic)["error"]["type"], "request_too_large") << anthropic;
}

TEST_F(SecurityFlags, BodyAtTheLimitIsRead) {
  int status = 0;
  const std::string r = raw_post("/detokenize", body_of(1 << 20), &status);
  EXPECT_EQ(status, 200) << r.substr(0, 200);
}

TEST_F(SecurityFlags, PreflightIsAnswered) {
  httplib::Client c = client();
  httplib::Result r = c.Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                          {"Access-Control-Request-Method", "POST"},
                                                          {"Access-Control-Request-Headers", "authorization,content-type"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  EXPECT_NE(r->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  const std::string headers = r->get_header_value("Access-Control-Allow-Headers");
  for (const char* h : {"Authorization", "Content-Type", "x-api-key", "anthropic-version"}) {
    EXPECT_NE(headers.find(h), std::string::npos) << h;
  }
  EXPECT_FALSE(r->get_header_value("Access-Control-Max-Age").empty());
}

TEST_F(SecurityFlags, OnlyTheConfiguredOriginGetsAllowOrigin) {
  httplib::Client c = client();
  httplib::Result ok = c.Post("/tokenize", {{"Origin", "http://app.example"}}, R"({"content": "hi"})",
                              "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  httplib::Result other = c.Post("/tokenize", {{"Origin", "http://evil.example"}}, R"({"content": "hi"})",
                                 "application/json");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
}

}  // namespace
}  // namespace magnetar
