// `magnetar bench`: prefill and decode speed at growing context depths, like llama-bench / ds4-bench.
// At each frontier d (ctx-start, ctx-start+step, ... <= ctx-max): the timeline holds d tokens, then the next
// `step` tokens are prefilled (timed) and `gen` tokens decoded one by one (timed); each measurement is
// repeated --reps times from the same frontier and the median reported. Token ids are random (seeded),
// which measures compute and memory traffic, not a particular text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace magnetar::tools {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_profile(const char* what, const std::vector<std::pair<std::string, double>>& ops, int64_t tokens,
                   int64_t depth) {
  double total = 0;
  for (const auto& [name, sec] : ops) total += sec;
  if (total <= 0) return;
  std::printf("# %s profile from depth %lld (%lld tokens): ms per token by op\n", what, (long long)depth,
              (long long)tokens);
  for (const auto& [name, sec] : ops) {
    if (sec > 0) std::printf("#   %-18s %9.3f ms %6.1f%%\n", name.c_str(), 1e3 * sec / double(tokens), 100 * sec / total);
  }
  std::printf("#   %-18s %9.3f ms\n", "total", 1e3 * total / double(tokens));
}

// Decode of `n` sessions at once against one: each repetition prefills `step` fresh random tokens into every
// session, then decodes `gen` tokens per session, one session alone (Session::step) and all together
// (Engine::step, one forward pass per token for all). Prints the medians: aggregate tokens/s of both.
int bench_sessions(Engine& engine, int64_t n, int64_t step, int64_t gen, int64_t reps, int64_t seed, bool json) {
  std::vector<std::unique_ptr<Session>> owned;
  std::vector<Session*> all;
  for (int64_t i = 0; i < n; ++i) {
    Result<std::unique_ptr<Session>> s = engine.new_session();
    if (!s.ok()) {
      std::fprintf(stderr, "magnetar bench: --sessions %lld: %s\n", (long long)n, s.status().message().c_str());
      return kExitFailure;
    }
    owned.push_back(std::move(s).value());
    all.push_back(owned.back().get());
  }
  std::mt19937_64 rng(uint64_t(seed) * 7919 + 1);
  const int64_t vocab = engine.info().n_vocab;
  auto fresh = [&](int64_t count) {
    std::vector<int32_t> t(static_cast<size_t>(count));
    for (int32_t& x : t) x = int32_t(rng() % uint64_t(vocab));
    return t;
  };
  std::vector<double> one, batched;
  for (int64_t r = 0; r < reps; ++r) {
    for (Session* s : all) {
      if (Status st = s->sync(fresh(step)); !st.ok()) {
        std::fprintf(stderr, "magnetar bench: %s\n", st.message().c_str());
        return kExitFailure;
      }
    }
    const std::vector<int32_t> ids = fresh(gen * n);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t g = 0; g < gen; ++g) {
      if (Status st = all[0]->step(ids[size_t(g)]); !st.ok()) {
        std::fprintf(stderr, "magnetar bench: %s\n", st.message().c_str());
        return kExitFailure;
      }
    }
    one.push_back(double(gen) / seconds(t0));
    // The batch continues every session from its prompt (session 0 from where it is: same cost per token).
    t0 = std::chrono::steady_clock::now();
    for (int64_t g = 0; g < gen; ++g) {
      if (Status st = engine.step(all, std::span<const int32_t>(ids).subspan(size_t(g * n), size_t(n))); !st.ok()) {
        std::fprintf(stderr, "magnetar bench: %s\n", st.message().c_str());
        return kExitFailure;
      }
    }
    batched.push_back(double(gen * n) / seconds(t0));
  }
  const double one_tps = median(one), batch_tps = median(batched);
  if (json) {
    const nlohmann::json row = {{"sessions", n}, {"decode_tokens_per_session", gen}, {"one_session_tps", one_tps},
                                {"batched_tps", batch_tps}, {"batched_tps_per_session", batch_tps / double(n)}};
    std::printf("%s\n", row.dump().c_str());
  } else {
    std::printf("# decode of %lld sessions at once (after %lld-token prompts, %lld tokens each, median of %lld): "
                "%.2f t/s in all, %.2f t/s per session; one session alone: %.2f t/s (%.2fx the throughput)\n",
                (long long)n, (long long)step, (long long)gen, (long long)reps, batch_tps, batch_tps / double(n),
                one_tps, batch_tps / std::max(one_tps, 1e-9));
  }
  return kExitOk;
}

// Time to first token for an n-token history (a conversation an agent resends), cold and from disk KV: per rep a
// fresh random history plus a 64-token new turn is prefilled in a new session (cold: every token computed; the
// full blocks go to --kv-disk-dir as they complete), then the same history with another 64-token turn in another
// new session (hit: the saved blocks are restored, the rest computed). Prints the medians.
int bench_ttft(Engine& engine, int64_t n, int64_t reps, int64_t seed, bool json) {
  constexpr int64_t kTurn = 64;
  std::mt19937_64 rng(uint64_t(seed) * 104729 + 7);
  const int64_t vocab = engine.info().n_vocab;
  std::vector<double> cold, hit;
  int64_t restored = 0;
  for (int64_t r = 0; r < reps; ++r) {
    std::vector<int32_t> history(static_cast<size_t>(n + kTurn));
    for (int32_t& t : history) t = int32_t(rng() % uint64_t(vocab));
    for (const bool warm : {false, true}) {
      if (warm) {
        for (int64_t i = n; i < n + kTurn; ++i) history[size_t(i)] = int32_t(rng() % uint64_t(vocab));  // a new turn
        (void)engine.kv_disk_stats();  // the cold run's blocks are all on disk before the clock starts
      }
      Result<std::unique_ptr<Session>> s = engine.new_session();
      if (!s.ok()) {
        std::fprintf(stderr, "magnetar bench: --ttft: %s\n", s.status().message().c_str());
        return kExitFailure;
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (Status st = s.value()->sync(history); !st.ok()) {
        std::fprintf(stderr, "magnetar bench: --ttft: %s\n", st.message().c_str());
        return kExitFailure;
      }
      (warm ? hit : cold).push_back(seconds(t0));
      if (warm) restored = s.value()->stats().restored_tokens;
    }
  }
  const KvDiskStats d = engine.kv_disk_stats();
  const double gb_s = d.restore_seconds > 0 ? double(d.bytes_read) / d.restore_seconds / 1e9 : 0.0;
  if (json) {
    const nlohmann::json row = {{"history_tokens", n}, {"turn_tokens", kTurn}, {"ttft_cold_s", median(cold)},
                                {"ttft_hit_s", median(hit)}, {"restored_tokens", restored}, {"restore_gb_s", gb_s},
                                {"kv_bytes_per_token", d.blocks_saved ? double(d.bytes_written) / double(d.blocks_saved) /
                                                                            double(engine.options().kv_disk.block_tokens)
                                                                      : 0.0}};
    std::printf("%s\n", row.dump().c_str());
  } else {
    std::printf("# time to first token, %lld-token history + %lld new tokens (median of %lld): cold %.2f s, from disk "
                "KV %.2f s (%.1fx; %lld tokens restored, restores at %.2f GB/s)\n",
                (long long)n, (long long)kTurn, (long long)reps, median(cold), median(hit),
                median(cold) / std::max(median(hit), 1e-9), (long long)restored, gb_s);
  }
  return kExitOk;
}

// --drafts K: the time of a decode step that computes k drafts besides its token (Session::step(id, drafts), all of
// them wrong: rewound after the step), k = 0, 1, 2, 4, ... K, at the session's depth: what speculative decoding
// (--lookup) pays for its guesses. Each run is `gen` steps from the same depth.
int bench_drafts(Session& session, std::span<const int32_t> ids, int64_t max_drafts, int64_t gen, int64_t reps,
                 bool json) {
  const size_t base = session.tokens().size();
  std::vector<int64_t> arms = {0};
  for (int64_t k = 1; k < max_drafts; k *= 2) arms.push_back(k);
  arms.push_back(max_drafts);
  if (!json) {
    std::printf(
        "# decode steps computing k drafts too (all wrong, then dropped: what --lookup pays), depth %zu, median "
        "of %lld runs of %lld steps\n%10s %12s %10s\n",
        base, (long long)reps, (long long)gen, "drafts", "ms/step", "x plain");
  }
  double plain = 0;
  for (const int64_t k : arms) {
    std::vector<double> ms;
    for (int64_t r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t g = 0; g < gen; ++g) {
        const std::span<const int32_t> drafts = ids.subspan(size_t(g), size_t(k));
        if (Status s = session.step(ids[size_t(g + k)], drafts); !s.ok()) {
          std::fprintf(stderr, "magnetar bench: %s\n", s.message().c_str());
          return kExitFailure;
        }
        session.rewind(session.tokens().size() - size_t(k));
      }
      ms.push_back(1e3 * seconds(t0) / double(gen));
      session.rewind(base);
    }
    const double step_ms = median(ms);
    if (k == 0) plain = step_ms;
    if (json) {
      std::printf(
          "%s\n",
          nlohmann::json({{"depth", base}, {"drafts", k}, {"step_ms", step_ms}, {"ratio_to_plain", step_ms / plain}})
              .dump()
              .c_str());
    } else {
      std::printf("%10lld %12.3f %10.2f\n", (long long)k, step_ms, step_ms / plain);
    }
  }
  return kExitOk;
}

}  // namespace

int bench_main(int argc, char** argv) {
  ModelFlags model;
  int64_t ctx_start = 2048, ctx_max = 65536, step = 2048, gen = 128, reps = 3, seed = 1, sessions = 1, ttft = 0;
  int64_t drafts = 0;
  bool json = false, csv = false, profile = false, expert_layers = false;
  cli::Args args("magnetar bench -m MODEL.gguf [--ctx-start N --ctx-max N --step N] [--gen N] [--reps N] [--json|--csv]",
                 "Measures prefill and decode tokens/s at growing context depths (median of --reps runs at each\n"
                 "depth). llama-bench's pp512/tg128 is --ctx-start 0 --ctx-max 0 --step 512 --gen 128.");
  model.add_to(args);
  args.option("--ctx-start", &ctx_start, "N", "first context depth");
  args.option("--ctx-max", &ctx_max, "N", "last context depth");
  args.option("--step", &step, "N", "tokens prefilled at each depth (and the distance between depths)");
  args.option("--gen", &gen, "N", "tokens decoded at each depth");
  args.option("--reps", &reps, "N", "repetitions per measurement (the median is reported)");
  args.option("--seed", &seed, "S", "seed of the random token ids");
  args.flag("--json", &json, "one JSON object per depth");
  args.flag("--csv", &csv, "CSV rows");
  args.flag("--expert-layers", &expert_layers, "streamed: after the table, hits, misses, bytes and read latency per layer during the last decode");
  args.flag("--profile", &profile, "after the table, where prefill and decode time goes at the last depth, per op");
  args.option("--sessions", &sessions, "N",
              "also decode N sessions at once (one batched forward pass per token, as `serve --parallel N` does) "
              "and print the aggregate tokens/s next to one session's");
  args.option("--drafts", &drafts, "K",
              "after the table: the time of a decode step that also computes 1, 2, 4, ... K drafts (all wrong) against "
              "a plain step, at the last depth: the cost of speculative decoding's guesses (--lookup)");
  args.option("--ttft", &ttft, "N",
              "instead of the table: time to first token for an N-token history plus a 64-token turn, cold and then "
              "restored from --kv-disk-dir (required)");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "bench")) return *code;
  // Each bounded by a context the engine can hold (2^24 tokens), so that their sums cannot overflow; --reps by what
  // a benchmark repeats (the fresh tokens of each repetition at depth 0 are allocated up front).
  constexpr int64_t kMaxTokens = int64_t(1) << 24;
  if (ctx_start < 0 || ctx_max < ctx_start || ctx_max > kMaxTokens || step < 1 || step > kMaxTokens || gen < 0 ||
      gen > kMaxTokens || reps < 1 || reps > 1000 || sessions < 1 || sessions > 256 || ttft < 0 || ttft > kMaxTokens ||
      drafts < 0 || drafts > kMaxLookupDrafts) {
    std::fprintf(stderr,
                 "magnetar bench: need 0 <= --ctx-start <= --ctx-max, --step >= 1, --gen >= 0 (each at most 16,777,216 "
                 "tokens), --reps in [1, 1000], --sessions in [1, 256], --ttft in [0, 16,777,216], --drafts in [0, "
                 "%d]\n",
                 kMaxLookupDrafts);
    return kExitBadInput;
  }
  if (json && csv) {
    std::fprintf(stderr, "magnetar bench: --json and --csv exclude each other\n");
    return kExitBadInput;
  }
  if ((sessions > 1 || drafts > 0) && gen == 0) {
    std::fprintf(stderr, "magnetar bench: %s measures decoding: it needs --gen >= 1\n",
                 sessions > 1 ? "--sessions" : "--drafts");
    return kExitBadInput;
  }
  if (ttft == 0 && !model.kv_disk_dir.empty()) {
    std::fprintf(stderr,
                 "magnetar bench: --kv-disk-dir is for --ttft (the table's repetitions would restore their "
                 "prompts from the disk instead of computing them)\n");
    return kExitBadInput;
  }
  if (ttft > 0 && (sessions > 1 || drafts > 0)) {
    std::fprintf(stderr, "magnetar bench: --sessions and --drafts do not apply to --ttft\n");
    return kExitBadInput;
  }
  if (ttft > 0) {
    if (model.kv_disk_dir.empty()) {
      std::fprintf(stderr, "magnetar bench: --ttft needs --kv-disk-dir DIR (where the history's KV is saved)\n");
      return kExitBadInput;
    }
    if (model.ctx == 0) model.ctx = ttft + 64;
    if (model.ctx < ttft + 64) {
      std::fprintf(stderr, "magnetar bench: --ctx %lld is smaller than --ttft + 64 = %lld\n", (long long)model.ctx,
                   (long long)(ttft + 64));
      return kExitBadInput;
    }
    std::unique_ptr<Engine> engine = model.load("bench");
    if (!engine) return kExitBadInput;
    return bench_ttft(*engine, ttft, reps, seed, json);
  }
  const int64_t need_ctx =
      std::max(ctx_max + step + gen + (drafts > 0 ? gen + drafts : 0), sessions > 1 ? step + 2 * gen : 0);
  // Each repetition at depth 0 prefills and decodes fresh tokens, drawn up front: at most 2^27 ids (512 MiB).
  if (need_ctx + (reps - 1) * (step + gen) > (int64_t(1) << 27)) {
    std::fprintf(stderr, "magnetar bench: --reps %lld x (--step + --gen) asks for %lld tokens, more than 134,217,728\n",
                 (long long)reps, (long long)(need_ctx + (reps - 1) * (step + gen)));
    return kExitBadInput;
  }
  if (model.ctx == 0) model.ctx = need_ctx;
  if (model.ctx < need_ctx) {
    std::fprintf(stderr, "magnetar bench: --ctx %lld is smaller than --ctx-max + --step + --gen = %lld\n",
                 (long long)model.ctx, (long long)need_ctx);
    return kExitBadInput;
  }
  model.profile = profile;
  if (sessions > 1 && gen > 0) model.sessions = sessions + 1;  // the depth sweep's session and the batched ones
  std::unique_ptr<Engine> engine = model.load("bench");
  if (!engine) return kExitBadInput;
  const ModelInfo& info = engine->info();
  Result<std::unique_ptr<Session>> opened = engine->new_session();
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar bench: %s\n", opened.status().message().c_str());
    return kExitFailure;
  }
  Session& session = *opened.value();

  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  // At depth 0 each repetition prefills and decodes its own tokens (ids beyond need_ctx): with the same
  // tokens, a later repetition would find the experts the earlier one routed to still cached.
  std::vector<int32_t> ids(static_cast<size_t>(need_ctx + (reps - 1) * (step + gen)));
  for (int32_t& t : ids) t = int32_t(rng() % uint64_t(info.n_vocab));

  // Untimed warm-up, as llama-bench's: a token prefilled and one decoded, so that one-time costs stay out of the first
  // measurement (the CUDA decode graph's capture and instantiation, ~18 ms on the H200: with --reps 1 it was inside
  // the first depth's 64 decoded tokens, 411 t/s at 2K instead of ~466).
  if (gen > 0) {
    Status warm = session.sync(std::span<const int32_t>(ids.data(), 1));
    if (warm.ok()) warm = session.step(ids[1]);
    if (!warm.ok()) {
      std::fprintf(stderr, "magnetar bench: %s\n", warm.message().c_str());
      return kExitFailure;
    }
    session.clear();
  }
  // What a decoded token reads (the mean over a depth's decoded tokens, at positions depth + step ..) and the memory's
  // peak: the table's decode GB/s and its share of the peak, the roofline of a resident decode.
  const DecodeBytes bytes = engine->decode_bytes();
  const double peak = engine->peak_bandwidth();
  if (!json && !csv) {
    std::printf("# magnetar %s | %s | %u cores, %d threads\n", MAGNETAR_VERSION, cpu_model().c_str(),
                std::thread::hardware_concurrency(), engine->options().n_threads);
    std::printf("# model %s (%s, %.2f GiB, %llu params) | kv %s | batch %lld | reps %lld (median)\n", info.path.c_str(),
                info.architecture.c_str(), double(info.file_bytes) / double(1ull << 30),
                (unsigned long long)info.n_params, model.kv_type.c_str(), (long long)engine->options().n_batch,
                (long long)reps);
    const std::string window = bytes.window > 0 ? format(" (at most %lld)", (long long)bytes.window) : "";
    std::printf("# decode reads per token %.3f GB of weights (%.3f GB of them routed experts) and %.1f KiB of K/V per "
                "cached token it attends%s",
                double(bytes.weights + bytes.experts) / 1e9, double(bytes.experts) / 1e9,
                double(bytes.kv_per_row) / 1024.0, window.c_str());
    if (peak > 0) std::printf("; memory bandwidth peak %.0f GB/s (the GPU's memory clock and bus width)", peak / 1e9);
    std::printf("\n%10s %10s %14s %10s %14s %12s %8s\n", "depth", "prefill", "prefill t/s", "decode", "decode t/s",
                "decode GB/s", "% peak");
  } else if (csv) {
    std::printf("depth,prefill_tokens,prefill_tps,decode_tokens,decode_tps,decode_bytes_per_token,decode_gbps\n");
  }
  std::vector<std::pair<std::string, double>> prefill_profile;
  int64_t last_depth = ctx_start;
  for (int64_t depth = ctx_start; depth <= ctx_max; depth += step) {
    last_depth = depth;
    std::vector<double> pp, tg;
    ExpertStats pp_experts, tg_experts;  // summed over the reps
    double pp_seconds = 0, tg_seconds = 0;
    for (int64_t r = 0; r < reps; ++r) {
      // Bring the timeline to exactly `depth` tokens (computed once, then reused from the KV cache).
      if (depth > 0) {
        if (Status s = session.sync(std::span<const int32_t>(ids.data(), size_t(depth))); !s.ok()) {
          std::fprintf(stderr, "magnetar bench: %s\n", s.message().c_str());
          return kExitFailure;
        }
      } else {
        session.clear();
      }
      const bool last = depth + step > ctx_max && r == reps - 1;  // profiled run: the last one
      if (last) session.reset_stats();
      engine->reset_expert_stats();
      auto t0 = std::chrono::steady_clock::now();
      const int32_t* seq = depth == 0 ? ids.data() + r * (step + gen) : ids.data();
      if (Status s = session.sync(std::span<const int32_t>(seq, size_t(depth + step))); !s.ok()) {
        std::fprintf(stderr, "magnetar bench: %s\n", s.message().c_str());
        return kExitFailure;
      }
      pp.push_back(double(step) / seconds(t0));
      pp_seconds += seconds(t0);
      pp_experts += engine->expert_stats();
      engine->reset_expert_stats();
      if (last) {
        prefill_profile = session.op_profile();
        session.reset_stats();
      }
      t0 = std::chrono::steady_clock::now();
      for (int64_t g = 0; g < gen; ++g) {
        if (Status s = session.step(seq[depth + step + g]); !s.ok()) {
          std::fprintf(stderr, "magnetar bench: %s\n", s.message().c_str());
          return kExitFailure;
        }
      }
      if (gen > 0) tg.push_back(double(gen) / seconds(t0));
      tg_seconds += seconds(t0);
      tg_experts += engine->expert_stats();
    }
    const double pp_tps = median(pp), tg_tps = median(tg);
    const double tg_bytes = bytes.at(double(depth + step) + double(gen + 1) / 2);
    const double tg_gbps = tg_bytes * tg_tps / 1e9;
    // The share of the GPU memory's peak, where that is the roofline: every weight resident (tiered experts come over
    // the bus, streamed ones from RAM and disk).
    const bool tiered = pp_experts.streamed || pp_experts.gpu_tier;
    const double share = peak > 0 && gen > 0 && !tiered ? tg_gbps * 1e9 / peak : 0;
    if (json) {
      nlohmann::json row = {{"depth", depth},         {"prefill_tokens", step}, {"prefill_tps", pp_tps},
                            {"decode_tokens", gen},   {"decode_tps", tg_tps},   {"threads", engine->options().n_threads},
                            {"model", info.path},     {"cpu", cpu_model()},     {"version", MAGNETAR_VERSION},
                            {"decode_bytes_per_token", tg_bytes}, {"decode_gbps", tg_gbps}};
      if (share > 0) row["decode_peak_fraction"] = share;
      if (tiered) {
        row["prefill_experts"] = expert_summary_json(pp_experts, pp_seconds, step * reps);
        row["decode_experts"] = expert_summary_json(tg_experts, tg_seconds, gen * reps);
      }
      std::printf("%s\n", row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (csv) {
      std::printf("%lld,%lld,%.3f,%lld,%.3f,%.0f,%.3f\n", (long long)depth, (long long)step, pp_tps, (long long)gen,
                  tg_tps, tg_bytes, tg_gbps);
    } else {
      std::printf("%10lld %10lld %14.2f %10lld %14.2f %12.1f %8s\n", (long long)depth, (long long)step, pp_tps,
                  (long long)gen, tg_tps, tg_gbps, share > 0 ? format("%.1f", 100 * share).c_str() : "-");
      if (tiered) {
        std::printf("  prefill %s\n", expert_summary(pp_experts, pp_seconds, step * reps).c_str());
        if (gen > 0) std::printf("  decode  %s\n", expert_summary(tg_experts, tg_seconds, gen * reps).c_str());
      }
    }
    std::fflush(stdout);
  }
  if (expert_layers && engine->expert_stats().streamed) {
    std::printf("# expert cache per layer, last decode (%lld tokens at depth %lld)\n", (long long)gen,
                (long long)last_depth);
    std::printf("%6s %8s %8s %8s %10s %10s %10s\n", "layer", "hits", "misses", "hit %", "MiB read", "ms/read", "wait ms");
    const std::vector<ExpertStats> layers = engine->expert_layer_stats();
    for (size_t l = 0; l < layers.size(); ++l) {
      const ExpertStats& s = layers[l];
      const uint64_t n = s.hits + s.inflight_hits + s.misses;
      if (n == 0) continue;
      std::printf("%6zu %8llu %8llu %8.1f %10.1f %10.1f %10.1f\n", l, (unsigned long long)s.hits,
                  (unsigned long long)s.misses, 100.0 * double(s.hits) / double(n), double(s.bytes_read) / double(1 << 20),
                  1e3 * s.read_seconds / double(std::max<uint64_t>(1, s.reads)), 1e3 * s.wait_seconds);
    }
  }
  if (sessions > 1 && gen > 0) {
    if (int code = bench_sessions(*engine, sessions, step, gen, reps, seed, json); code != kExitOk) return code;
  }
  if (profile) {
    print_profile("prefill", prefill_profile, step, last_depth);
    if (gen > 0) print_profile("decode", session.op_profile(), gen, last_depth + step);
  }
  if (drafts > 0) return bench_drafts(session, ids, drafts, gen, reps, json);
  return kExitOk;
}

}  // namespace magnetar::tools
