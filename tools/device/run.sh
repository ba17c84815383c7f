#!/usr/bin/env bash
# One call on the GPU machine (device tool): build with CUDA for Hopper, run every test suite (the CPU
# kernel tests there also cover AVX-512), run the kernel benchmarks, and leave results under $OUT.
#
# Usage (from the device tool, repo root): bash tools/device/run.sh [bench-filter]
# The image has no network: what it lacks travels in .device-deps/ and .device-deps-dev/ (carry=[".device-deps",
# ".device-deps-dev"]), see below. Binaries built on the CPU box by tools/device/prebuild.sh (carry=["build-prebuilt",
# ".device-deps"]: they need the runtime libraries only) replace the build here when they match the sources: the bench
# modes run the packed magnetar, `run.sh '^none$' REGEX` runs ctest over the packed test binaries. (A call's carry and
# tracked files must stay under 64 MiB: the tracked tree is ~43 MB, the packed binaries ~17 MB.)
set -uo pipefail
OUT=${OUT:-/tmp/magnetar-out}
mkdir -p "$OUT"
filter=${1:-.}
tests=${2:-}  # a ctest -R regex: run only those tests and no benchmarks (a quick check on a warm machine)
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# Dependencies the image lacks travel as Debian .debs, unpacked into a private prefix, never over the image's /usr: the
# runtime libraries in .device-deps/ (`apt-get download libpcre2-8-0 liburing2 libcpp-httplib0.11 libssl3 libbrotli1`
# here) and what building needs besides in .device-deps-dev/ (`apt-get download nlohmann-json3-dev libpcre2-dev
# liburing-dev libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev`).
prefix=/tmp/magnetar-deps
if ls .device-deps*/*.deb >/dev/null 2>&1; then
  for deb in .device-deps*/*.deb; do dpkg -x "$deb" "$prefix"; done
  for pc in "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i "s#^prefix=/usr#prefix=$prefix/usr#" "$pc"
  done
  export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Debian's multiarch headers (openssl's opensslconf.h) live under include/x86_64-linux-gnu
  export CPATH="$prefix/usr/include/x86_64-linux-gnu:$prefix/usr/include${CPATH:+:$CPATH}"
fi

# Packed binaries (tools/device/prebuild.sh): unpacked into build-cuda/, used when built from these sources and loadable
# (never over a build tree of this machine's own: one with a CMakeCache.txt).
prebuilt=0
if [ -f build-prebuilt/prebuilt.tar.xz ] && [ ! -f build-cuda/CMakeCache.txt ]; then
  . tools/device/source_hash.sh
  rm -rf build-cuda && tar -xJf build-prebuilt/prebuilt.tar.xz
  missing=$(ldd build-cuda/tools/magnetar $(ls build-cuda/tests/magnetar_cuda_tests 2>/dev/null) | grep "not found" |
    head -1)
  if [ "$(cat build-cuda/prebuilt.sum 2>/dev/null)" != "$(source_hash)" ]; then
    log "prebuilt binaries: built from other sources than these (rerun tools/device/prebuild.sh); building here"
  elif [ -n "$missing" ]; then
    log "prebuilt binaries: a library is missing here ($missing); building here"
  else
    prebuilt=1
    log "prebuilt binaries: in use (sources $(cat build-cuda/prebuilt.sum))"
  fi
fi

# The bench modes below need only the magnetar binary: the packed one, or configured here on a fresh machine (tests
# and benches off), rebuilt incrementally in the build-device/ of an earlier call on a warm one. Sets bin.
bin=build-device/tools/magnetar
build_magnetar() {
  if [ "$prebuilt" = 1 ]; then bin=build-cuda/tools/magnetar; return; fi
  [ -d build-device ] || cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAGNETAR_CUDA=ON \
    -DMAGNETAR_TESTS=OFF -DMAGNETAR_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$prefix/usr" >/dev/null 2>&1
  cmake --build build-device -j "$(nproc)" --target magnetar >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
}
# The binary (build_magnetar) and the synthetic Qwen3-30B-A3B-geometry Q4_K model the bench modes run (made once per
# machine, ~15 s). Sets bin and model. SYNTH_SKEW=S: the model has skewed routing (`synth --skew S`), not uniform.
# SYNTH_TYPE=T: weights of `synth --type T` (e.g. q4_k_m, llama.cpp's Q4_K_M mix) instead of q4_k.
model=/tmp/magnetar-q30-${SYNTH_TYPE:-q4k}${SYNTH_SKEW:+-skew$SYNTH_SKEW}.gguf
build_with_model() {
  build_magnetar
  [ -f "$model" ] || { /usr/bin/time -f "synth %e s" "$bin" synth --preset qwen3-30b-a3b --type "${SYNTH_TYPE:-q4_k}" \
    ${SYNTH_SKEW:+--skew $SYNTH_SKEW} -t "$(nproc)" -o "$model" 2>&1 | tail -2; }
}

# An arm of --decode-bench / --prefill-bench: VAR=VALUE ... sets environment switches for the packed (or built)
# binary; ARM=NAME runs instead the magnetar of other sources that `tools/device/prebuild.sh --arm NAME` packed into
# build-prebuilt/arm-NAME.xz (an A/B of two code versions in one call). Runs `magnetar ARGS...` under the arm.
run_arm() {
  local arm=$1
  shift
  case "$arm" in
    ARM=*)
      local b=/tmp/magnetar-arm-${arm#ARM=}
      [ -x "$b" ] || { xz -dc "build-prebuilt/arm-${arm#ARM=}.xz" >"$b" && chmod +x "$b"; } || return 1
      "$b" "$@" ;;
    *) env $arm "$bin" "$@" ;;
  esac
}

# Decode over 64 tokens at depth 2K, 16K, 32K and 64K (2,048-token prefill chunks) of the model, under the arm given
# (run_arm: "VAR=VALUE ..." or ARM=NAME; none: the default) with the bench flags in DEPTH_FLAGS (e.g. "--kv-type q8_0");
# DEPTH_RANGE replaces the depths' flags (e.g. "--ctx 8192 --ctx-start 1024 --ctx-max 5120 --step 1024 --reps 3
# --batch 1024" with DEPTH_ROWS='[0-9]+': 1K to 5K).
depth_arm() {
  run_arm "${1:-}" bench -m "$model" --device cuda ${DEPTH_RANGE:---ctx 67700 --ctx-start 2048 --ctx-max 65536 --step \
    2048 --reps 1 --batch 2048} --gen 64 ${DEPTH_FLAGS:-} 2>&1 |
    grep -E "^ *(${DEPTH_ROWS:-2048|16384|32768|65536}) |depth" | head -40
}

# `run.sh --stream-arms`: only the expert-streaming and disk-KV arms (tools/device/stream_arms.sh), with the
# build-device/ of an earlier call on the same (still warm) machine.
if [ "$filter" = "--stream-arms" ]; then
  bash tools/device/stream_arms.sh 2>&1 | tail -40
  exit 0
fi

# `run.sh --model-bench`: the CUDA forward pass on a synthetic Qwen3-30B-A3B-geometry Q4_K model (ANCHORS.md's
# llama.cpp figures are for this geometry on this GPU), with the build-device/ of an earlier call on the same
# (still warm) machine: pp512 / tg128 and pp2048 (medians of 5), decode at depth 2K to 64K, then the experts
# tiered (GPU pool + RAM cache + disk).
if [ "$filter" = "--model-bench" ]; then
  build_with_model
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader
  "$bin" bench -m "$model" --device cuda --show-plan --ctx-start 0 --ctx-max 0 --step 512 --gen 128 --reps 5 2>&1 | tail -8
  "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 2048 --gen 16 --reps 5 --ctx 4096 2>&1 | tail -4
  echo "baseline: decode attention on FP32 cores (MAGNETAR_CUDA_DECODE_MMA=0, a diagnostic switch)"
  MAGNETAR_CUDA_DECODE_MMA=0 "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 \
    --reps 5 2>&1 | tail -2
  echo "comparison: quantization fused into the norms and swiglu (MAGNETAR_CUDA_FUSE=1, off by default)"
  MAGNETAR_CUDA_FUSE=1 "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 \
    --reps 5 2>&1 | tail -2
  echo "baseline: decode launched kernel by kernel (MAGNETAR_CUDA_GRAPH=0, a diagnostic switch)"
  MAGNETAR_CUDA_GRAPH=0 "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 --reps 5 \
    2>&1 | tail -2
  echo "baseline: prefill on the matrix-vector kernel (MAGNETAR_CUDA_MMQ=0, a diagnostic switch)"
  MAGNETAR_CUDA_MMQ=0 "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 16 --reps 5 \
    2>&1 | tail -3
  depth_arm
  echo "baseline: the same depths with decode attention on FP32 cores (MAGNETAR_CUDA_DECODE_MMA=0)"
  depth_arm MAGNETAR_CUDA_DECODE_MMA=0
  # The consumer-GPU setting: ~4 GiB of GPU memory in all (non-expert weights ~1.0 GiB, a 2.25 GiB expert pool,
  # KV and scratch) and an 8 GiB RAM expert cache streaming from disk (O_DIRECT: the page cache does not help).
  # SKIP_TIERED=1 leaves it out (~90 s: when the device budget is short and only resident kernels changed).
  [ "${SKIP_TIERED:-0}" = 1 ] && exit 0
  "$bin" bench -m "$model" --device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census --show-plan \
    --ctx-start 0 --ctx-max 0 --step 128 --gen 64 --reps 3 2>&1 | tail -12
  echo "the same with --gpu-cache-policy lru (the default is lfu)"
  "$bin" bench -m "$model" --device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census \
    --gpu-cache-policy lru --ctx-start 0 --ctx-max 0 --step 128 --gen 64 --reps 3 2>&1 | tail -5
  exit 0
fi

# `run.sh --depth-bench [ARM ...]`: only decode at depth 2K to 64K (2,048-token prefill chunks) on the resident 30B-A3B
# geometry, with F16 KV and then with Q8_0 KV (DEPTH_KV="q8_0 fp8": those instead), each for the default and then for every
# arm given (as --decode-bench's). Printed: the depths 2K, 16K, 32K and 64K (DEPTH_ROWS='[0-9]+': every 2K).
if [ "$filter" = "--depth-bench" ]; then
  build_with_model
  for kv in ${DEPTH_KV:-f16 q8_0}; do
    for arm in "" "${@:2}"; do
      echo "KV $kv ${arm:-default}"
      DEPTH_FLAGS="--kv-type $kv" depth_arm "$arm"
    done
  done
  exit 0
fi

# The tiered benches' model with routing skew $1 (`synth --skew`, made once per machine). Sets model.
tier_model() {
  model=/tmp/magnetar-q30-q4k-skew$1.gguf
  [ -f "$model" ] || "$bin" synth --preset qwen3-30b-a3b --type q4_k --skew "$1" -t "$(nproc)" -o "$model" >/dev/null 2>&1
}

# `run.sh --tier-bench`: only the consumer-GPU setting (experts tiered: a 2.25 GiB GPU pool, an 8 GiB RAM cache
# over disk), plain, with the CPU expert lane and with next-layer prefetch, on uniform routing and on a skewed one
# (`synth --skew 1`);
# builds the binary when needed.
if [ "$filter" = "--tier-bench" ]; then
  build_magnetar
  for skew in 0 1; do
    tier_model "$skew"
    for lane in "" --cpu-experts --prefetch; do
      echo "== skew $skew ${lane:-(no CPU lane, no prefetch)}"
      "$bin" bench -m "$model" --device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census $lane --show-plan \
        --ctx-start 0 --ctx-max 0 --step 128 --gen 64 --reps 3 2>&1 |
        grep -E "page-locked|CPU expert lane|^ +0 |pool|experts:|prefetch"
    done
  done
  exit 0
fi

# `run.sh --lane-bench [ARM ...]`: the CPU expert lane's share in the consumer-GPU setting (a 2.25 GiB GPU pool, an 8
# GiB RAM cache over disk; uniform and skewed routing): tg64 / pp128 (medians of LANE_REPS, default 5) without the
# lane, with it balanced against the copies (the default), with every cold miss on it (MAGNETAR_CUDA_LANE_BALANCE=0)
# and, for each arm given (run_arm), without the lane and balanced under that arm (LANE_ARMS: the first three to run,
# default "none balanced all"); the round of arms LANE_ROUNDS times (default 1), interleaved; LANE_SKEWS: the routing
# skews (default "0 1").
if [ "$filter" = "--lane-bench" ]; then
  build_magnetar
  for skew in ${LANE_SKEWS:-0 1}; do
    tier_model "$skew"
    for round in $(seq "${LANE_ROUNDS:-1}"); do
      for arm in ${LANE_ARMS:-none balanced all} "${@:2}"; do
        runs=("$arm")
        case "$arm" in none | balanced | all) ;; *) runs=("$arm none" "$arm balanced") ;; esac
        for run in "${runs[@]}"; do
          echo "== skew $skew, lane $run"
          lane=--cpu-experts
          [ "${run##* }" = none ] && lane=
          balance=MAGNETAR_CUDA_LANE_BALANCE=$([ "$run" = all ] && echo 0 || echo 1)
          run_arm "$([ "$run" = "${run##* }" ] && echo "$balance" || echo "${run% *}")" bench -m "$model" \
            --device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census $lane --ctx-start 0 --ctx-max 0 \
            --step 128 --gen 64 --reps "${LANE_REPS:-5}" 2>&1 | grep -E "^ +0 |pool|experts:"
        done
      done
    done
  done
  exit 0
fi

# `run.sh --cpu-bench [ARM ...]`: the CPU backend on this host's cores (docs/benchmarks/2026-12-06-cpu-threadpool-chunks.md):
# pp64 / tg32 (medians of 5) of CPU_LAYERS layers (default 16) of the 30B-A3B geometry, Q4_K, resident, with -t of
# every core, unloaded and beside N busy loops for each N in CPU_LOADS (default "0 1 4"), for the default and each arm
# given (run_arm), the arms interleaved CPU_ROUNDS times (default 2).
if [ "$filter" = "--cpu-bench" ]; then
  build_magnetar
  model=/tmp/magnetar-q30-q4k-l${CPU_LAYERS:-16}.gguf
  [ -f "$model" ] || "$bin" synth --preset qwen3-30b-a3b --type q4_k --layers "${CPU_LAYERS:-16}" -t "$(nproc)" \
    -o "$model" >/dev/null 2>&1
  for load in ${CPU_LOADS:-0 1 4}; do
    busy=()
    for _ in $(seq "$load"); do sh -c 'while :; do :; done' & busy+=($!); done
    for round in $(seq "${CPU_ROUNDS:-2}"); do
      for arm in "" "${@:2}"; do
        echo "== $load busy loops, round $round, ${arm:-default}"
        run_arm "$arm" bench -m "$model" --device cpu --resident -t "$(nproc)" --ctx-start 0 --ctx-max 0 --step 64 \
          --gen 32 --reps 5 2>&1 | grep -E "^ +0 "
      done
    done
    [ "$load" = 0 ] || kill "${busy[@]}"
  done
  exit 0
fi

# `run.sh --sweep-bench [ARM ...]`: prefill of long prompts in the consumer-GPU setting (the 30B-A3B geometry, a 2.25
# GiB GPU pool, an 8 GiB RAM cache over disk, 512-token chunks): chunk by chunk (`--sweep 0`) at CHUNKED_STEPS tokens
# (default "2048 8192"), then in one prefill sweep (`--sweep` of the prompt's length) at SWEEP_STEPS tokens (default
# "2048 8192 16384"), each followed by 32 decoded tokens; each arm given (run_arm) runs the sweeps too.
if [ "$filter" = "--sweep-bench" ]; then
  build_with_model
  tier=(--device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census --ctx-start 0 --ctx-max 0 --gen 32 --reps 1)
  pick() { grep -E "^ +0 |pool|experts:|sweep"; }
  for step in ${CHUNKED_STEPS:-2048 8192}; do
    echo "== --sweep 0 (chunk by chunk), $step tokens"
    "$bin" bench -m "$model" "${tier[@]}" --ctx $((step + 64)) --sweep 0 --step "$step" --show-plan 2>&1 | pick
  done
  for arm in "" "${@:2}"; do
    for step in ${SWEEP_STEPS:-2048 8192 16384}; do
      echo "== one sweep ${arm:-default}, $step tokens"
      run_arm "$arm" bench -m "$model" "${tier[@]}" --ctx $((step + 64)) --sweep "$step" --step "$step" --show-plan \
        2>&1 | pick
    done
  done
  exit 0
fi

# `run.sh --stall-bench`: how long a running stream stalls while `magnetar serve` computes another request's long
# prompt in the consumer-GPU setting (bench/serve_stall.py: a 2.25 GiB GPU pool over an 8 GiB RAM cache, the 30B-A3B
# geometry with a byte-level tokenizer): prompts of STALL_TOKENS (default 16384) tokens in prefill sweeps (the default)
# and chunk by chunk (`--sweep 0`), STALL_ROUNDS rounds each (default 3).
if [ "$filter" = "--stall-bench" ]; then
  build_magnetar
  stall_model=/tmp/magnetar-q30-q4k-bytes.gguf
  [ -f "$stall_model" ] || MAGNETAR=$bin SYNTH_FLAGS="--preset qwen3-30b-a3b --type q4_k -t $(nproc)" \
    python3 bench/serve_stall.py "$stall_model" --make-model 2>&1 | tail -1
  tokens=${STALL_TOKENS:-16384}
  for arm in "" "--sweep 0"; do
    echo "== serve ${arm:-with sweeps}, $tokens-token prompt"
    MAGNETAR=$bin python3 bench/serve_stall.py "$stall_model" --prompt-tokens "$tokens" --rounds "${STALL_ROUNDS:-3}" \
      --a-tokens 300 -- --device cuda --gpu-cache-gb 2.25 --stream --cache-gb 8 --no-census --ctx $((tokens + 600)) \
      $arm 2>&1 | tail -4
  done
  exit 0
fi

# `run.sh --attn-prefill`: prefill at depth with the tensor-core attention (attention_prefill_mma) and without it
# (MAGNETAR_CUDA_ATTN_MMA=0, the baseline), 2,048-token chunks up to 32K, then pp512 / pp2048 with it.
if [ "$filter" = "--attn-prefill" ]; then
  build_with_model
  for mma in 1 0; do
    echo "== MAGNETAR_CUDA_ATTN_MMA=$mma"
    MAGNETAR_CUDA_ATTN_MMA=$mma "$bin" bench -m "$model" --device cuda --ctx 34900 --ctx-start 2048 --ctx-max 32768 \
      --step 2048 --gen 16 --reps 1 --batch 2048 2>&1 | grep -E "^ *(2048|8192|16384|32768) |depth"
  done
  "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 16 --reps 5 2>&1 | tail -2
  "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 2048 --gen 16 --reps 5 --ctx 4096 2>&1 | tail -2
  exit 0
fi

# `run.sh --attn-bench`: the attention kernels alone (bench/cuda/attention_bench.cpp: decode at 2K-64K context,
# a 2,048-token prefill chunk at 0-64K, medians of 5), then one ncu --set full report of the tensor-core decode
# kernel at 64K ($OUT/ncu_attention.txt; the key lines printed). Needs the benchmarks built (a full run.sh call before it).
if [ "$filter" = "--attn-bench" ]; then
  b=build-device/bench/magnetar_bench_cuda_attention
  [ -x "$b" ] || { echo "no $b: run a full run.sh call first"; exit 1; }
  "$b" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_min_time=0.05s \
    >"$OUT/attn_bench.txt" 2>&1
  grep -E "median|^Run" "$OUT/attn_bench.txt" | sed 's/ \+/ /g'
  ncu --set full -k regex:attention_decode_mma_kernel --launch-count 1 "$b" \
    --benchmark_filter='attention_decode_mma/ctx65536' \
    --benchmark_min_time=0.01s >"$OUT/ncu_attention.txt" 2>&1
  echo "ncu exit $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|\
Block Limit|L1/TEX Hit|L2 Hit|Issue Slots Busy|No Eligible|Stall|One or More" "$OUT/ncu_attention.txt" | head -40
  echo "the same over a Q8_0 cache:"
  ncu --set full -k regex:attention_decode_mma_kernel --launch-count 1 "$b" \
    --benchmark_filter='attention_decode_mma_q8/ctx65536' \
    --benchmark_min_time=0.01s >"$OUT/ncu_attention_q8.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit Shared|Issue Slots Busy|No Eligible" \
    "$OUT/ncu_attention_q8.txt" | head -12
  exit 0
fi

# `run.sh --profile-decode`: GPU time per kernel of decode (ncu, 2 tokens' worth of launches after warm-up, each kernel
# alone) on the resident 30B-A3B geometry. The steps' timeline with its overlaps and gaps: --kernel-trace.
if [ "$filter" = "--profile-decode" ]; then
  build_with_model
  per_token=${PER_TOKEN_LAUNCHES:-438}  # launches per decode token of the 30B-A3B geometry (kernel trace, 2026-12-01)
  ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip $((per_token * 4)) \
    --launch-count $((per_token * 2)) --print-summary per-kernel "$bin" run -m "$model" --device cuda --tokens 1,2,3 \
    -n 8 >"$OUT/ncu.txt" 2>&1
  echo "ncu exit $?"
  python3 tools/device/ncu_table.py "$OUT/ncu.txt" 30  # the whole report is $OUT/ncu.txt
  exit 0
fi

# `run.sh --kernel-trace [VAR=VALUE ...]`: the GPU timeline of 32 decode steps (`bench --gen 32`, after a prompt of
# TRACE_STEP tokens, default 512 as in tg128: attention's cost grows with the context) of the resident 30B-A3B
# geometry, kernel by kernel inside the graph, with the copies and the host's graph launches
# (tools/device/kernel_trace.cpp: a CUPTI injection library built here against the image's CUPTI; nsys is not usable
# on the image), summarized by tools/device/kernel_gaps.py: per kernel the busy time it adds to a step and the idle
# time before it, and the time between steps. Environment switches (VAR=VALUE) apply to the traced run; TRACE_FLAGS
# adds bench flags (e.g. "--kv-type q8_0"); TRACE_STEPS=longest summarizes the batched steps of TRACE_FLAGS="--sessions N"
# (kernel_gaps.py's KERNELS argument).
if [ "$filter" = "--kernel-trace" ]; then
  build_with_model
  cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  inc=$(dirname "$(find "$cuda/" -name cupti.h 2>/dev/null | head -1)")
  lib=$(dirname "$(find "$cuda/" -name 'libcupti.so*' 2>/dev/null | head -1)")
  [ -f "$inc/cupti.h" ] && [ -d "$lib" ] ||
    { echo "kernel-trace: no CUPTI (cupti.h, libcupti.so) under $cuda"; exit 1; }
  g++ -std=c++17 -O2 -shared -fPIC -I"$cuda/include" -I"$inc" tools/device/kernel_trace.cpp -L"$lib" \
    -Wl,-rpath,"$lib" -lcupti -o /tmp/libkernel_trace.so || exit 1
  env "${@:2}" CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT="$OUT/kernel_trace.csv" "$bin" bench \
    -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step "${TRACE_STEP:-512}" --gen 32 --reps 1 \
    ${TRACE_FLAGS:-} >/dev/null \
    2>"$OUT/kernel_trace.err"
  echo "traced run exit $? ($(($(wc -l <"$OUT/kernel_trace.csv") - 1)) kernels; stderr: $OUT/kernel_trace.err)"
  python3 tools/device/kernel_gaps.py "$OUT/kernel_trace.csv" 20 40 ${TRACE_STEPS:-}
  exit 0
fi

# `run.sh --profile-prefill`: GPU time per kernel of one 512-token prefill (ncu, every launch of the prompt's forward
# pass; the per-kernel table is $OUT/ncu_prefill.txt) on the resident 30B-A3B geometry.
if [ "$filter" = "--profile-prefill" ]; then
  build_with_model
  ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel "$bin" run -m "$model" \
    --device cuda --tokens "$(seq -s, 1 512)" -n 1 >"$OUT/ncu_prefill.txt" 2>&1
  echo "ncu exit $?"
  python3 tools/device/ncu_table.py "$OUT/ncu_prefill.txt" 30
  exit 0
fi

# `run.sh --decode-bench [ARM ...]`: only pp512 / tg128 (medians of 5) on the resident 30B-A3B geometry, then the
# same for each arm (run_arm: diagnostic switches VAR=VALUE such as MAGNETAR_CUDA_FUSE=1, or ARM=NAME for another
# build), compared in the same call. DECODE_ROUNDS=N repeats the whole round of arms N times (interleaved A/B);
# DECODE_FLAGS adds bench flags (e.g. "--kv-type q8_0").
# MAGNETAR_CUDA_SKIP=NAME,... arms are knockouts: those kernels are not launched (wrong results), the time saved is
# their share of the decode step inside the graph, launch boundaries included (ncu times kernels alone).
if [ "$filter" = "--decode-bench" ]; then
  build_with_model
  for round in $(seq "${DECODE_ROUNDS:-1}"); do
    for arm in "" "${@:2}"; do
      echo "== ${arm:-default}"
      run_arm "$arm" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 --reps 5 \
        ${DECODE_FLAGS:-} 2>&1 | tail -1
    done
  done
  exit 0
fi

# `run.sh --lookup-bench [ARM ...]`: speculative decoding by prompt lookup (docs/benchmarks/2026-12-05-lookup-decoding.md)
# on the resident 30B-A3B geometry: what a step with k drafts costs (`bench --drafts 7` at 640 rows, 16K and, unless
# LOOKUP_DEEP=0, 64K with fp8 KV), then `run --lookup 0` against `--lookup 7` on a prompt of 40 random ids repeated 4
# times (the output loops) and on 600 random ids, 256 greedy tokens each, LOOKUP_ROUNDS times (default 2), the outputs
# compared byte for byte; the default first, then each arm (run_arm) in the same call.
if [ "$filter" = "--lookup-bench" ]; then
  build_with_model
  loop=$(python3 -c "import random; random.seed(3); p=[random.randrange(1000,100000) for _ in range(40)]; print(','.join(map(str,p*4)))")
  fresh=$(python3 -c "import random; random.seed(5); print(','.join(str(random.randrange(1000,100000)) for _ in range(600)))")
  for arm in "" "${@:2}"; do
    a=${arm:-default}
    f=${a//[^A-Za-z0-9_.-]/_}  # in the output files' names
    echo "== $a: drafts' cost, 640 rows"
    run_arm "$arm" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 --reps 5 --drafts 7 \
      2>&1 | tail -6
    echo "== $a: drafts' cost, 16K"
    run_arm "$arm" bench -m "$model" --device cuda --ctx-start 16384 --ctx-max 16384 --step 512 --gen 64 --reps 5 \
      --drafts 7 2>&1 | tail -6
    if [ "${LOOKUP_DEEP:-1}" != 0 ]; then
      echo "== $a: drafts' cost, 64K, fp8 KV"
      run_arm "$arm" bench -m "$model" --device cuda --ctx-start 65536 --ctx-max 65536 --step 2048 --batch 2048 \
        --gen 64 --reps 3 --drafts 7 --kv-type fp8 2>&1 | tail -6
    fi
    for prompt in loop fresh; do
      for round in $(seq "${LOOKUP_ROUNDS:-2}"); do
        for k in 0 7; do
          echo "== $a: $prompt prompt, round $round, --lookup $k"
          run_arm "$arm" run -m "$model" --device cuda --tokens "${!prompt}" -n 256 --temp 0 --lookup "$k" 2>&1 \
            >"$OUT/lookup-$f-$prompt-$k.txt" | grep -a "generated\|lookup:"
        done
      done
      cmp -s "$OUT/lookup-$f-$prompt-0.txt" "$OUT/lookup-$f-$prompt-7.txt" && echo "== $a, $prompt: the same text" ||
        echo "== $a, $prompt: the texts DIFFER"
    done
  done
  exit 0
fi

# `run.sh --sessions-bench [ARM ...]`: batched decode of SESSIONS sessions at once (default "4 8"; `bench --sessions N
# --gen 64 --reps 3`: one session's t/s and the aggregate, medians of 3) on the resident 30B-A3B geometry, then the same
# for each arm (run_arm) in the same call; DECODE_ROUNDS=N repeats the round of arms.
if [ "$filter" = "--sessions-bench" ]; then
  build_with_model
  for round in $(seq "${DECODE_ROUNDS:-1}"); do
    for arm in "" "${@:2}"; do
      for n in ${SESSIONS:-4 8}; do
        echo "== ${arm:-default}, $n sessions"
        run_arm "$arm" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 64 --reps 3 \
          --sessions "$n" 2>&1 | tail -2
      done
    done
  done
  exit 0
fi

# `run.sh --decode-profile [ARM]`: tg128 with `bench --profile` (the decode step split per op: the device's span, the
# host's share, the embedding) on the resident 30B-A3B geometry.
if [ "$filter" = "--decode-profile" ]; then
  build_with_model
  run_arm "${2:-}" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 128 --reps 5 --profile \
    2>&1 | tail -14
  exit 0
fi

# `run.sh --prefill-bench [ARM ...]`: pp512 and pp2048 (medians of 5) on the resident 30B-A3B geometry, then the
# same for each arm (run_arm) in the same call; last, pp2048 in 512-token chunks
# (`--batch 512`, llama-bench's default ubatch; the engine's default on a resident GPU model is 2,048).
if [ "$filter" = "--prefill-bench" ]; then
  build_with_model
  for arm in "" "${@:2}"; do
    echo "== ${arm:-default}"
    run_arm "$arm" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 512 --gen 0 --reps 5 2>&1 | tail -1
    run_arm "$arm" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 2048 --gen 0 --reps 5 --ctx 4096 \
      2>&1 | tail -1
  done
  echo "== --batch 512"
  "$bin" bench -m "$model" --device cuda --ctx-start 0 --ctx-max 0 --step 2048 --gen 0 --reps 5 --ctx 4096 --batch 512 \
    2>&1 | tail -1
  exit 0
fi

# `run.sh --ncu-kernel REGEX [SKIP]`: ncu --set full of one launch (NCU_COUNT launches) of the kernels whose name
# matches REGEX, after SKIP
# (default 200) of them, while the resident 30B-A3B geometry decodes (environment switches pass through: compare a
# kernel with MAGNETAR_CUDA_FUSE=1 and without); NCU_TOKENS=$(seq -s, 1 512) profiles a 512-token prefill instead. The key lines are printed; the report is $OUT/ncu_<n>.txt.
if [ "$filter" = "--ncu-kernel" ]; then
  build_with_model
  report="$OUT/ncu_$(ls "$OUT" | grep -c '^ncu_').txt"
  ncu --set full -k "regex:$2" --launch-skip "${3:-200}" --launch-count "${NCU_COUNT:-1}" "$bin" run -m "$model" \
    --device cuda --tokens "${NCU_TOKENS:-1,2,3}" -n 8 >"$report" 2>&1
  echo "ncu exit $? ($report)"
  grep -E "^  [a-z_:<>, ]+\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|\
Warp Cycles Per Issued|L2 Hit|spends" "$report" | cut -c1-400 | head -$((30 * ${NCU_COUNT:-1}))
  exit 0
fi

# `run.sh --ncu-stalls REGEX [SKIP]`: why the warps of one launch of the kernels matching REGEX wait (ncu: cycles per
# issued instruction spent in each stall reason, and the issue rate), same launch choice and NCU_TOKENS as --ncu-kernel.
if [ "$filter" = "--ncu-stalls" ]; then
  build_with_model
  m=smsp__average_warps_issue_stalled
  reasons="long_scoreboard short_scoreboard barrier mio_throttle lg_throttle math_pipe_throttle wait not_selected \
selected dispatch_stall no_instruction membar drain sleeping branch_resolving tex_throttle imc_miss misc"
  metrics=$(for r in $reasons; do printf '%s_%s_per_issue_active.ratio,' $m "$r"; done)
  ncu --metrics "${metrics}smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum" \
    -k "regex:$2" --launch-skip "${3:-200}" --launch-count "${NCU_COUNT:-1}" "$bin" run -m "$model" --device cuda \
    --tokens "${NCU_TOKENS:-1,2,3}" -n 8 >"$OUT/ncu_stalls.txt" 2>&1
  echo "ncu exit $?"
  grep -E "\(|stalled|issue_active|duration" "$OUT/ncu_stalls.txt" | sed "s/$m//" | sort -k3 -n -r | head -24
  exit 0
fi

# `run.sh --kv-ttft`: time to first token for a 100K-token history plus a new turn, cold vs restored from disk KV
# (issue: disk KV), on the 30B-A3B geometry on the GPU (98 KiB of KV per token); builds the binary when needed.
if [ "$filter" = "--kv-ttft" ]; then
  build_with_model
  rm -rf /tmp/magnetar-kv-ttft
  "$bin" bench -m "$model" --device cuda --ttft 100000 --kv-disk-dir /tmp/magnetar-kv-ttft --kv-disk-gb 24 \
    --batch 2048 --reps 1 2>&1 | tail -3
  exit 0
fi

log "machine: $(lscpu | sed -n 's/^Model name: *//p') / $(nproc) cores / $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
# Tests only (`run.sh '^none$' REGEX`) with packed binaries: ctest over them, nothing built here.
test_dir=build-device
prebuilt_tests=0
if [ "$prebuilt" = 1 ] && [ -n "$tests" ]; then
  [ -x build-cuda/tests/magnetar_cuda_tests ] && prebuilt_tests=1 ||
    log "prebuilt binaries: magnetar only (prebuild.sh --bench), no test binaries; building here"
fi
if [ "$prebuilt_tests" = 1 ]; then
  test_dir=build-cuda
  log "tests over the prebuilt binaries"
else
  cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAGNETAR_CUDA=ON \
    -DMAGNETAR_TESTS=ON -DMAGNETAR_BENCH=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$prefix/usr" \
    >"$OUT/configure.log" 2>&1 \
    || { log "configure failed"; tail -30 "$OUT/configure.log"; exit 1; }
  # -k 0: a file that fails (another compiler's stricter C++20) does not stop the rest; what built is still run.
  # Tests only: the GPU's test binaries and magnetar (what the bench modes run after it in the same call), not
  # the CPU tests and benchmarks.
  targets=()
  [ -n "$tests" ] && targets=(--target magnetar magnetar_cuda_tests magnetar_golden_tests)
  if ! cmake --build build-device -j "$(nproc)" "${targets[@]}" -- -k 0 >"$OUT/build.log" 2>&1; then
    log "build FAILED (continuing with what built): $(grep -c '^FAILED' "$OUT/build.log") targets"
    grep -E "^FAILED|error:" "$OUT/build.log" | head -30 | tee -a "$OUT/summary.txt"
  else
    log "build ok"
  fi
fi

(cd "$test_dir" && ctest --output-on-failure -j 8 --timeout 600 ${tests:+-R "$tests"}) >"$OUT/ctest.log" 2>&1
log "ctest exit $?: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "Failed|\*\*\*|SKIP" "$OUT/ctest.log" | head -30 | tee -a "$OUT/summary.txt"
if [ -n "$tests" ]; then cat "$OUT/summary.txt"; exit 0; fi
./build-device/tests/magnetar_kernel_tests --gtest_brief=1 >"$OUT/kernel_tests.log" 2>&1
log "kernel tests (this CPU's ISAs) exit $?: $(tail -1 "$OUT/kernel_tests.log")"

if [ -x build-device/bench/magnetar_bench_quant ]; then
  ./build-device/bench/magnetar_bench_quant --benchmark_filter="$filter" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$OUT/bench_quant.json" --benchmark_out_format=json \
    >"$OUT/bench_quant.txt" 2>&1
  log "bench exit $?"
  grep median "$OUT/bench_quant.txt" | head -80
fi
# CUDA matvec: GB/s of weights per matvec against the 4.8 TB/s roofline (text only: $OUT returns at most 8 files)
if [ -x build-device/bench/magnetar_bench_cuda ]; then
  ./build-device/bench/magnetar_bench_cuda --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.1s >"$OUT/bench_cuda.txt" 2>&1
  log "cuda bench exit $?"
  grep median "$OUT/bench_cuda.txt" | head -80
fi
# Stage transitions: a dependent launch against a barrier of a persistent launch's CTAs (bench/cuda/sync_bench.cu;
# appended to bench_cuda.txt, same file limit)
if [ -x build-device/bench/magnetar_bench_cuda_sync ]; then
  ./build-device/bench/magnetar_bench_cuda_sync --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    >>"$OUT/bench_cuda.txt" 2>&1
  log "sync bench exit $?"
  grep -E "sync_.*median" "$OUT/bench_cuda.txt"
fi
cat "$OUT/summary.txt"
