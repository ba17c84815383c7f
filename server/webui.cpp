#include "server/webui.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/worker.h"

namespace magnetar::server {

using json = nlohmann::ordered_json;

namespace {

// Every page resource comes from this server and nothing else: no inline script or style, no framing, no plugins,
// no form posts. The page reaches only its own origin (fetch to /v1/...); canvas and blob images stay allowed.
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// Model text may hold invalid UTF-8 (a path, a name): replace it rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply_json(httplib::Response& res, const json& body) {
  res.set_header("Cache-Control", "no-cache");
  res.set_content(dump(body), "application/json");
}

void reply_asset(httplib::Response& res, const WebAsset& asset) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_content(reinterpret_cast<const char*>(asset.bytes.data()), asset.bytes.size(),
                  std::string(asset.content_type));
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

// ---- GET /v1/status ---------------------------------------------------------------------------------------------

json model_json(const Engine& engine, const std::string& model_id) {
  const ModelInfo& m = engine.info();
  return {{"id", model_id},
          {"name", m.name},
          {"architecture", m.architecture},
          {"path", m.path},
          {"n_params", m.n_params},
          {"file_bytes", m.file_bytes},
          {"n_vocab", m.n_vocab},
          {"n_ctx_train", m.n_ctx_train},
          {"n_ctx", engine.options().n_ctx},
          {"n_layer", m.n_layer},
          {"n_embd", m.n_embd},
          {"n_expert", m.n_expert},
          {"n_expert_used", m.n_expert_used},
          {"n_threads", engine.options().n_threads},
          {"load_seconds", engine.load_seconds()}};
}

// hit_rate: acquisitions served by the RAM cache, ready (null when experts are resident or none was acquired);
// inflight_hit_rate: those found still being read (a prefetch's).
json experts_json(const ExpertStats& s) {
  const uint64_t acquired = s.hits + s.inflight_hits + s.misses;
  const bool rated = s.streamed && acquired > 0;
  return {{"streamed", s.streamed},
          {"store", s.store},
          {"hits", s.hits},
          {"inflight_hits", s.inflight_hits},
          {"misses", s.misses},
          {"acquired", acquired},
          {"hit_rate", rated ? json(ratio(double(s.hits), double(acquired))) : json()},
          {"inflight_hit_rate", rated ? json(ratio(double(s.inflight_hits), double(acquired))) : json()},
          {"evictions", s.evictions},
          {"reads", s.reads},
          {"bytes_read", s.bytes_read},
          {"read_seconds", s.read_seconds},
          {"wait_seconds", s.wait_seconds},
          {"prefetch_issued", s.prefetch_issued},
          {"prefetch_used", s.prefetch_used},
          {"prefetch_wasted", s.prefetch_wasted},
          {"predicted", s.predicted},
          {"acquired_with_hint", s.acquired_with_hint},
          {"gpu_tier", s.gpu_tier},
          {"gpu_slots", s.gpu_slots},
          {"gpu_hits", s.gpu_hits},
          {"gpu_misses", s.gpu_misses},
          {"gpu_cpu_experts", s.gpu_cpu_experts},
          {"gpu_lookups", s.gpu_lookups()},
          {"gpu_hit_rate", s.gpu_tier && s.gpu_lookups() > 0
                               ? json(ratio(double(s.gpu_hits), double(s.gpu_lookups())))
                               : json()},
          {"gpu_bytes_h2d", s.gpu_bytes_h2d}};
}

json kv_disk_json(const KvDiskStats& s) {
  return {{"enabled", s.enabled},
          {"where", s.where},
          {"blocks_on_disk", s.blocks_on_disk},
          {"bytes_on_disk", s.bytes_on_disk},
          {"foreign_blocks", s.foreign_blocks},
          {"foreign_bytes", s.foreign_bytes},
          {"blocks_saved", s.blocks_saved},
          {"blocks_restored", s.blocks_restored},
          {"blocks_evicted", s.blocks_evicted},
          {"blocks_declined", s.blocks_declined},
          {"blocks_rejected", s.blocks_rejected},
          {"tokens_restored", s.tokens_restored},
          {"bytes_written", s.bytes_written},
          {"bytes_read", s.bytes_read},
          {"save_seconds", s.save_seconds},
          {"restore_seconds", s.restore_seconds}};
}

json status_json(const Engine& engine, const WorkerStats& w, const std::string& model_id) {
  // How many experts sit in each tier now (from the published map).
  uint64_t in_tier[4] = {0, 0, 0, 0};
  for (uint8_t t : w.expert_map.tier) {
    if (t < 4) in_tier[t]++;
  }
  json experts = experts_json(w.experts);
  experts["in_tier"] = {{"disk", in_tier[ExpertMap::kDisk]},
                        {"ram", in_tier[ExpertMap::kRam]},
                        {"resident", in_tier[ExpertMap::kResident]},
                        {"gpu", in_tier[ExpertMap::kGpu]}};
  return {{"model", model_json(engine, model_id)},
          {"plan", engine.memory_plan()},
          {"worker",
           {{"active", w.active},
            {"queued", w.queued},
            {"prompt_tokens", w.prompt_tokens},
            {"cached_tokens", w.cached_tokens},
            {"generated_tokens", w.generated_tokens},
            {"prompt_seconds", w.prompt_seconds},
            {"generation_seconds", w.generation_seconds},
            // The KV tiers: prompt tokens reused from the session's KV in RAM (the previous request's prefix).
            {"kv_reuse_rate", ratio(double(w.cached_tokens), double(w.prompt_tokens))},
            {"last_generated_tokens", w.last_generated_tokens},
            {"last_generation_seconds", w.last_generation_seconds},
            {"decode_tokens_per_second", ratio(double(w.last_generated_tokens), w.last_generation_seconds)}}},
          {"experts", std::move(experts)},
          {"kv_disk", kv_disk_json(w.kv_disk)}};
}

// ---- GET /v1/experts/map ----------------------------------------------------------------------------------------

json expert_map_json(const ExpertMap& map) {
  json tier = json::array(), uses = json::array();
  for (int64_t l = 0; l < map.n_layer; ++l) {
    json t = json::array(), u = json::array();
    for (int64_t e = 0; e < map.n_expert; ++e) {
      const size_t k = size_t(l * map.n_expert + e);
      t.push_back(k < map.tier.size() ? map.tier[k] : 0);
      u.push_back(k < map.uses.size() ? map.uses[k] : 0);
    }
    tier.push_back(std::move(t));
    uses.push_back(std::move(u));
  }
  // Indexed by ExpertMap::Tier.
  return {{"n_layer", map.n_layer},
          {"n_expert", map.n_expert},
          {"tiers", {"disk", "ram", "resident", "gpu"}},
          {"tier", std::move(tier)},
          {"uses", std::move(uses)}};
}

// "app.js" -> "/webui/app\.js": a route pattern (httplib's are regular expressions) that matches the path only.
std::string route_of(std::string_view path) {
  std::string out = "/webui/";
  for (char c : path) {
    if (std::string_view(".+*?^$()[]{}|\\").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

void add_webui_routes(httplib::Server& http, const Engine& engine, Worker& worker, const std::string& model_id) {
  for (const WebAsset& asset : web_assets()) {
    auto serve = [&asset](const httplib::Request&, httplib::Response& res) { reply_asset(res, asset); };
    http.Get(route_of(asset.path), serve);
    // GET / is the page; HEAD / (Claude Code's probe) gets its headers and 200, as before the UI existed.
    if (asset.path == "index.html") http.Get("/", serve);
  }
  http.Get("/v1/status", [&engine, &worker, model_id](const httplib::Request&, httplib::Response& res) {
    reply_json(res, status_json(engine, worker.stats(), model_id));
  });
  http.Get("/v1/experts/map", [&worker](const httplib::Request&, httplib::Response& res) {
    reply_json(res, expert_map_json(worker.stats().expert_map));
  });
}

}  // namespace magnetar::server
