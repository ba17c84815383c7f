#!/usr/bin/env bash
# Expert streaming benchmark: one `magnetar bench` per arm on a model larger than RAM, page cache dropped
# before each arm (needs root for /proc/sys/vm/drop_caches; without it the arms after the first start warm).
#
#   bench/stream_bench.sh MODEL.gguf OUT_DIR ARM...
#
# An ARM is a label and the magnetar flags, separated by ':', e.g. "mmap:--mmap" "s16:--cache-gb 16 --no-census".
# Each arm: --ctx-start 0 --ctx-max 0 --step $STEP --gen $GEN --reps $REPS (defaults 8, 16, 5: medians of 5
# prefills of 8 tokens and 5 decodes of 16 tokens, every repetition on its own random tokens).
# Writes OUT_DIR/LABEL.json (bench --json) and OUT_DIR/LABEL.err (the memory plan), and prints a summary.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0" >&2; exit 2; }
model=$1 out=$2; shift 2
bin=${MAGNETAR:-build/tools/magnetar}
STEP=${STEP:-8} GEN=${GEN:-16} REPS=${REPS:-5}
mkdir -p "$out"
for arm in "$@"; do
  label=${arm%%:*} flags=${arm#*:}
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "warning: cannot drop the page cache" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086
  /usr/bin/time -f "max RSS %M KiB, %e s, major faults %F" "$bin" bench -m "$model" --ctx-start 0 --ctx-max 0 \
    --step "$STEP" --gen "$GEN" --reps "$REPS" --json $flags > "$out/$label.json" 2> "$out/$label.err"
  python3 - "$out/$label.json" "$label" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
line = f"{sys.argv[2]:>14}: prefill {row['prefill_tps']:.3f} t/s, decode {row['decode_tps']:.3f} t/s"
d = row.get("decode_experts")
if d:
    line += (f" | decode hit {100*d['hit_rate']:.1f}%, {d['bytes_per_token']/2**20:.0f} MiB/token read, "
             f"{d['disk_mb_s']:.0f} MB/s, wait {100*d['wait_fraction']:.0f}%, recall {100*d['prediction_recall']:.0f}%")
print(line + f" ({sys.argv[3]} s)")
PY
  tail -1 "$out/$label.err"
done
