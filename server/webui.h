// The web UI of `magnetar serve`: a chat page, a status panel and a live expert map, served from files compiled into
// the binary (server/webui/, turned into byte arrays at build time by server/webui/embed.cmake: no build step of its
// own, nothing fetched from elsewhere at run time), and the two JSON endpoints the page polls.
//
// Threads (STYLE.md rule 10): the endpoints read only the worker's published snapshot (Worker::stats(): expert
// statistics, expert map, disk KV statistics) and what the engine fixed at load (ModelInfo, the memory plan,
// options); they never call into the engine while the worker computes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "engine/engine.h"

namespace httplib {
class Server;
}

namespace magnetar::server {

class Worker;

// One embedded file. `bytes` stays valid for the life of the program.
struct WebAsset {
  std::string_view path;          // relative to server/webui/: "index.html", "app.js"
  std::string_view content_type;  // from the extension, with charset=utf-8 for text
  std::span<const uint8_t> bytes;
};

// The embedded files (generated: build/server/webui_assets.cpp), in the order CMake lists them.
std::span<const WebAsset> web_assets();

// Registers GET / (index.html), GET /webui/FILE for every embedded file, GET /v1/status and GET /v1/experts/map.
// A path under /webui/ that names no embedded file has no route (the server's 404). `model_id` is the name
// /v1/models reports. `engine` and `worker` must outlive `http`'s serving.
void add_webui_routes(httplib::Server& http, const Engine& engine, Worker& worker, const std::string& model_id);

}  // namespace magnetar::server
