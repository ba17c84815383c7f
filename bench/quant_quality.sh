#!/usr/bin/env bash
# Quantization quality of one model: perplexity, KL divergence and top-1 agreement against the F32 model for
# each weight type, in both perplexity modes, as a markdown table (docs/benchmarks/*-quant-quality.md).
#
#   bench/quant_quality.sh HF_DIR TEXT_FILE OUT_DIR [WINDOWS] [TYPES...]
#
# HF_DIR: a Hugging Face folder (e.g. the demo model's, tools/train/README.md); TEXT_FILE: held-out text
# (e.g. build/corpus/heldout.txt, documents separated by <|endoftext|>, read with --special). Writes the
# GGUFs, the KL base files and table.md under OUT_DIR. WINDOWS (default 200) bounds the work: each window is
# --ctx 512 tokens and its KL base file takes 256 positions x 2 x n_vocab bytes in windowed mode.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,10p "$0" >&2; exit 2; }
hf=$1 text=$2 out=$3 windows=${4:-200}
shift $(( $# >= 4 ? 4 : 3 ))
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(bf16 q8_0 q6_k q5_k q4_k q3_k q2_k iq4_nl)
bin=${MAGNETAR:-build/tools/magnetar}
mkdir -p "$out"

"$bin" convert "$hf" -o "$out/f32.gguf" --outtype f32 >&2
for t in "${types[@]}"; do
  if [ "$t" = bf16 ]; then "$bin" convert "$hf" -o "$out/$t.gguf" --outtype bf16 >&2
  else "$bin" quantize "$out/f32.gguf" -o "$out/$t.gguf" --type "$t" >&2; fi
done

ppl() {  # model mode extra-args... -> one JSON line
  local model=$1 mode=$2; shift 2
  "$bin" perplexity -m "$model" -f "$text" --special --ctx 512 --mode "$mode" --max-windows "$windows" --json "$@"
}
for mode in windowed continuous; do
  ppl "$out/f32.gguf" $mode --kl-base "$out/kl-base-$mode.bin" > "$out/f32-$mode.json"
  for t in "${types[@]}"; do ppl "$out/$t.gguf" $mode --kl "$out/kl-base-$mode.bin" > "$out/$t-$mode.json"; done
  rm -f "$out/kl-base-$mode.bin"
done

python3 - "$out" f32 "${types[@]}" > "$out/table.md" <<'PY'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
print("| type | file MiB | bits/weight | PPL windowed | PPL continuous | KL mean (windowed) | KL p99 | top-1 % |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
f32 = os.path.getsize(f"{out}/f32.gguf")
for n in names:
    w = json.load(open(f"{out}/{n}-windowed.json")); c = json.load(open(f"{out}/{n}-continuous.json"))
    size = os.path.getsize(f"{out}/{n}.gguf")
    kl = f"{w['kl_mean']:.5f} ± {w['kl_mean_err']:.5f}" if "kl_mean" in w else "(base)"
    p99 = f"{w['kl_p99']:.4f}" if "kl_p99" in w else ""
    top1 = f"{w['top1_agreement']:.2f}" if "top1_agreement" in w else ""
    print(f"| {n} | {size/2**20:.2f} | {32*size/f32:.2f} | {w['ppl']:.4f} ± {w['ppl_err']:.4f} | "
          f"{c['ppl']:.4f} ± {c['ppl_err']:.4f} | {kl} | {p99} | {top1} |")
PY
cat "$out/table.md"
