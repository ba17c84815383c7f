#!/usr/bin/env bash
# The expert-streaming and disk-KV benchmark arms on the GPU host's CPU and disk (called by run.sh with
# --stream-arms, after its build): a synthetic Qwen3-235B-A22B-geometry Q4_K model truncated to 12 layers
# (~17 GB, skewed popularity) and its packed copy, each streamed with a 4 GiB cache, merged reads as measured
# (default) vs adjacent-only (--read-gap-kib 0); prefill (64-token chunks) and decode arms, medians of 5, page
# cache dropped per arm; then the disk KV restore benchmark. The summary goes to $OUT/stream_summary.txt, every
# arm's JSON and plan into $OUT/stream.tgz (the device tool returns at most 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/magnetar-out}
bin=build-device/tools/magnetar
dir=${STREAM_DIR:-/tmp/magnetar-stream}
res=$dir/results
mkdir -p "$res" "$dir"
model=$dir/q235-12-q4k.gguf
packed=$dir/q235-12-q4k.packed.gguf
[ -f "$model" ] || "$bin" synth --preset qwen3-235b-a22b --layers 12 --type q4_k --skew 1 -t "$(nproc)" -o "$model" \
  > "$res/synth.log" 2>&1 || { echo "synth failed"; tail -5 "$res/synth.log"; exit 1; }
[ -f "$packed" ] || "$bin" pack "$model" -o "$packed" > "$res/pack.log" 2>&1 \
  || { echo "pack failed"; tail -5 "$res/pack.log"; exit 1; }
dd if="$model" of=/dev/null bs=4M count=1000 iflag=direct 2>&1 | tail -1 | tee "$res/dd.txt"
export MAGNETAR=$bin
common="--device cpu --cache-gb 4 --no-census -t $(nproc)"
STEP=64 GEN=4 REPS=5 bash bench/stream_bench.sh "$model" "$res/prefill-std" \
  "measured:$common" "adjacent:$common --read-gap-kib 0" 2>&1 | tee -a "$res/summary.txt"
STEP=64 GEN=4 REPS=5 bash bench/stream_bench.sh "$packed" "$res/prefill-packed" \
  "measured:$common" "adjacent:$common --read-gap-kib 0" 2>&1 | tee -a "$res/summary.txt"
STEP=8 GEN=32 REPS=5 bash bench/stream_bench.sh "$model" "$res/decode-std" \
  "measured:$common" "adjacent:$common --read-gap-kib 0" 2>&1 | tee -a "$res/summary.txt"
STEP=8 GEN=32 REPS=5 bash bench/stream_bench.sh "$packed" "$res/decode-packed" \
  "measured:$common" "adjacent:$common --read-gap-kib 0" 2>&1 | tee -a "$res/summary.txt"
if [ -x build-device/bench/magnetar_bench_kv ]; then
  build-device/bench/magnetar_bench_kv "$dir/kv" --reps 5 2>&1 | tee "$res/kv_disk.txt"
fi
cp "$res/summary.txt" "$OUT/stream_summary.txt" 2>/dev/null
cat "$res/kv_disk.txt" >> "$OUT/stream_summary.txt" 2>/dev/null
tar -czf "$OUT/stream.tgz" -C "$dir" results
