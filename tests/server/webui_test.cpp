// The web UI of `magnetar serve` (server/webui.h): the embedded page and its headers, GET /v1/status and
// GET /v1/experts/map, and the page itself in headless Chromium (tests/webui/webui.test.mjs, driven by playwright-core
// from npm). The server runs the demo model streamed with a small expert cache (97 slots for 8 x 16 experts), so
// the map has experts both on disk and in RAM; --no-census keeps each run cold and writes nothing next to the model.
// --device cpu: on a GPU machine the hot experts would sit in the GPU pool instead (tests/cuda covers that tier).
#include <filesystem>
#include <numeric>

#include "tests/npm_cache.h"
#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

// The demo model's shape (models/magnetar-demo.report.json): every layer is MoE, 16 experts, 4 per token.
constexpr int64_t kDemoLayers = 8;
constexpr int64_t kDemoExperts = 16;
constexpr int64_t kDemoTopK = 4;

// Pinned: the browser test's only npm package (it drives the Debian chromium; it downloads no browser of its own).
constexpr const char* kPlaywright = "playwright-core@1.65.1";
constexpr const char* kChromium = "/usr/bin/chromium";

class WebUi : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    start_server({"--stream", "--cache-gb", "0.02", "--no-census", "--device", "cpu", "--ctx", "2048"});
  }

  static json get(const std::string& path) {
    httplib::Client c = client();
    httplib::Result r = c.Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << path;
    return json::parse(r->body, nullptr, false);
  }
  // uses[l][e] summed over experts, per layer.
  static std::vector<uint64_t> uses_per_layer(const json& map) {
    std::vector<uint64_t> out;
    for (const json& row : map["uses"]) {
      uint64_t sum = 0;
      for (const json& u : row) sum += u.get<uint64_t>();
      out.push_back(sum);
    }
    return out;
  }
};

TEST_F(WebUi, PageIsServedWithItsPolicy) {
  httplib::Client c = client();
  httplib::Result page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page->get_header_value("Cache-Control"), "no-cache");
  const std::string csp = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << csp;
  EXPECT_EQ(page->body.rfind("<!doctype html>", 0), 0u) << page->body.substr(0, 100);
  EXPECT_NE(page->body.find("/webui/app.js"), std::string::npos);

  httplib::Result index = c.Get("/webui/index.html");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->body, page->body);
  const std::pair<const char*, const char*> assets[] = {{"/webui/app.js", "text/javascript; charset=utf-8"},
                                                        {"/webui/style.css", "text/css; charset=utf-8"}};
  for (const auto& [path, type] : assets) {
    httplib::Result r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), type) << path;
    EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache") << path;
    EXPECT_FALSE(r->get_header_value("Content-Security-Policy").empty()) << path;
    EXPECT_GT(r->body.size(), 1000u) << path;
    // Nothing is loaded from elsewhere: no absolute URL in any asset.
    EXPECT_EQ(r->body.find("http://"), std::string::npos) << path;
    EXPECT_EQ(r->body.find("https://"), std::string::npos) << path;
  }
  EXPECT_EQ(page->body.find("http://"), std::string::npos);
  EXPECT_EQ(page->body.find("https://"), std::string::npos);

  // Claude Code probes HEAD / before it talks to the server.
  httplib::Result head = c.Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
}

TEST_F(WebUi, UnknownAssetIs404) {
  for (const char* path : {"/webui/x", "/webui/", "/webui/app.jsx", "/webui/../server.cpp", "/webui/appXjs"}) {
    httplib::Client c = client();
    httplib::Result r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    const json body = json::parse(r->body, nullptr, false);
    EXPECT_EQ(body["error"]["type"], "not_found_error") << path << ": " << r->body;
  }
}

TEST_F(WebUi, StatusShape) {
  post("/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"temperature", 0}, {"max_tokens", 6}});
  const json s = get("/v1/status");
  ASSERT_TRUE(s.is_object()) << s.dump();
  const json& m = s["model"];
  EXPECT_EQ(m["id"], "magnetar-demo-q8_0");
  EXPECT_FALSE(m["name"].get<std::string>().empty());
  EXPECT_EQ(m["architecture"], "qwen3moe");
  EXPECT_NE(m["path"].get<std::string>().find("magnetar-demo-q8_0.gguf"), std::string::npos);
  EXPECT_GT(m["n_params"].get<uint64_t>(), 0u);
  EXPECT_GT(m["n_ctx"].get<int64_t>(), 0);
  EXPECT_EQ(m["n_layer"], kDemoLayers);
  EXPECT_EQ(m["n_expert"], kDemoExperts);
  EXPECT_EQ(m["n_expert_used"], kDemoTopK);
  EXPECT_NE(s["plan"].get<std::string>().find("memory plan: streamed"), std::string::npos) << s["plan"];

  const json& w = s["worker"];
  for (const char* key :
       {"active", "queued", "prompt_tokens", "cached_tokens", "generated_tokens", "last_generated_tokens"}) {
    EXPECT_TRUE(w[key].is_number_integer()) << key << ": " << w.dump();
  }
  for (const char* key : {"prompt_seconds", "generation_seconds", "kv_reuse_rate", "last_generation_seconds",
                          "decode_tokens_per_second"}) {
    EXPECT_TRUE(w[key].is_number()) << key << ": " << w.dump();
  }
  EXPECT_EQ(w["active"], 0);
  EXPECT_GE(w["generated_tokens"].get<int64_t>(), 6);
  EXPECT_EQ(w["last_generated_tokens"], 6);  // the request above, which ran to max_tokens
  EXPECT_GT(w["decode_tokens_per_second"].get<double>(), 0);

  const json& e = s["experts"];
  EXPECT_EQ(e["streamed"], true);
  EXPECT_FALSE(e["store"].get<std::string>().empty());
  const uint64_t acquired =
      e["hits"].get<uint64_t>() + e["inflight_hits"].get<uint64_t>() + e["misses"].get<uint64_t>();
  EXPECT_EQ(e["acquired"].get<uint64_t>(), acquired);
  EXPECT_GT(acquired, 0u);
  ASSERT_TRUE(e["hit_rate"].is_number()) << e.dump();
  EXPECT_DOUBLE_EQ(e["hit_rate"].get<double>(), double(e["hits"].get<uint64_t>()) / double(acquired));
  EXPECT_GT(e["bytes_read"].get<uint64_t>(), 0u);  // a cold cache read experts from disk
  const json& in_tier = e["in_tier"];
  EXPECT_EQ(in_tier["disk"].get<int64_t>() + in_tier["ram"].get<int64_t>() + in_tier["resident"].get<int64_t>() +
                in_tier["gpu"].get<int64_t>(),
            kDemoLayers * kDemoExperts);
  EXPECT_GT(in_tier["ram"].get<int64_t>(), 0);
  EXPECT_EQ(in_tier["resident"], 0);

  const json& kv = s["kv_disk"];
  EXPECT_EQ(kv["enabled"], false);
  for (const char* key : {"blocks_on_disk", "bytes_on_disk", "blocks_saved", "blocks_restored", "tokens_restored",
                          "bytes_written", "bytes_read"}) {
    EXPECT_EQ(kv[key], 0) << key;
  }
}

// Every token the engine computes is routed to top_k experts in every MoE layer, and each of those is one use. A
// request computes its uncached prompt tokens and all generated tokens but the last (sampled, and left for the next
// request's sync to compute when generation stops at max_tokens).
TEST_F(WebUi, ExpertMapCountsEveryRoutedToken) {
  const json before = get("/v1/experts/map");
  const json r =
      post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"temperature", 0}, {"max_tokens", 5}});
  ASSERT_EQ(r["choices"][0]["finish_reason"], "length") << r.dump();
  const json after = get("/v1/experts/map");
  for (const json* map : {&before, &after}) {
    EXPECT_EQ((*map)["n_layer"], kDemoLayers);
    EXPECT_EQ((*map)["n_expert"], kDemoExperts);
    EXPECT_EQ((*map)["tiers"], json({"disk", "ram", "resident", "gpu"}));
    ASSERT_EQ((*map)["tier"].size(), size_t(kDemoLayers));
    ASSERT_EQ((*map)["uses"].size(), size_t(kDemoLayers));
    for (int64_t l = 0; l < kDemoLayers; ++l) {
      ASSERT_EQ((*map)["tier"][l].size(), size_t(kDemoExperts));
      ASSERT_EQ((*map)["uses"][l].size(), size_t(kDemoExperts));
      for (const json& t : (*map)["tier"][l]) {
        // Streamed: each expert is on disk (0) or in the RAM cache (1), never resident (2).
        EXPECT_TRUE(t == 0 || t == 1) << t;
      }
    }
  }
  const json& usage = r["usage"];
  const int64_t computed = usage["prompt_tokens"].get<int64_t>() -
                           usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>() +
                           usage["completion_tokens"].get<int64_t>() - 1;
  ASSERT_GT(computed, 0);
  const std::vector<uint64_t> was = uses_per_layer(before), now = uses_per_layer(after);
  for (int64_t l = 0; l < kDemoLayers; ++l) {
    EXPECT_EQ(now[size_t(l)] - was[size_t(l)], uint64_t(computed * kDemoTopK)) << "layer " << l;
  }
  EXPECT_EQ(std::accumulate(now.begin(), now.end(), uint64_t(0)) - std::accumulate(was.begin(), was.end(), uint64_t(0)),
            uint64_t(computed * kDemoLayers * kDemoTopK));
  int in_ram = 0;
  for (const json& row : after["tier"]) {
    for (const json& t : row) in_ram += t == 1;
  }
  EXPECT_GT(in_ram, 0) << "experts just used should be in the RAM cache";

  // The same request again reuses all of its prompt but the last token.
  const json again =
      post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"temperature", 0}, {"max_tokens", 5}});
  const json third = get("/v1/experts/map");
  const int64_t computed_again = again["usage"]["prompt_tokens"].get<int64_t>() -
                                 again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>() +
                                 again["usage"]["completion_tokens"].get<int64_t>() - 1;
  EXPECT_EQ(computed_again, 5) << again.dump();
  const std::vector<uint64_t> then = uses_per_layer(third);
  for (int64_t l = 0; l < kDemoLayers; ++l) {
    EXPECT_EQ(then[size_t(l)] - now[size_t(l)], uint64_t(computed_again * kDemoTopK)) << "layer " << l;
  }
}

// The page in headless Chromium: chat with a streamed answer, Stop, conversations kept across a reload, markdown,
// the status panel and the expert map (tests/webui/webui.test.mjs). Screenshots go to BUILD/tests/webui-*.png.
TEST_F(WebUi, BrowserChatStopStatusAndMap) {
  if (!std::filesystem::exists(kChromium)) {
    GTEST_SKIP() << "SKIP: " << kChromium << " not found (Debian package chromium; scripts/setup.sh installs it)";
  }
  if (testing::run_shell("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "SKIP: node not found on PATH";
  const std::string skip = testing::ensure_npm_packages(kPlaywright);
  if (!skip.empty()) GTEST_SKIP() << "SKIP: " << kPlaywright << " unavailable: " << skip;
  const std::string script = std::string(MAGNETAR_SOURCE_DIR) + "/tests/webui/webui.test.mjs";
  const std::string out_dir = std::string(MAGNETAR_BUILD_DIR) + "/tests";
  const std::string log = out_dir + "/webui-test.log";
  std::filesystem::create_directories(out_dir);
  const std::string cmd = "node " + testing::shell_quote(script) + " " + testing::shell_quote(testing::npm_dir()) +
                          " http://127.0.0.1:" + std::to_string(server->port) + " " + testing::shell_quote(out_dir) +
                          " >" + testing::shell_quote(log) + " 2>&1";
  const int rc = testing::run_shell(cmd);
  const std::string output = testing::tail_of(log, 20000);
  std::printf("%s", output.c_str());
  EXPECT_EQ(rc, 0) << "webui.test.mjs failed (log: " << log << "):\n" << output;
}

}  // namespace
}  // namespace magnetar
