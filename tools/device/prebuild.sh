#!/usr/bin/env bash
# Builds the GPU binaries on this machine (no GPU needed: nvcc compiles for sm_90) and packs them for the device, so
# that a device call spends its minutes running rather than building (a cold build of magnetar there takes ~90 s, the
# CUDA and golden test binaries ~60 s more).
#
# Usage (repo root, after committing or not): bash tools/device/prebuild.sh
#        bash tools/device/prebuild.sh --arm NAME: only magnetar, packed as build-prebuilt/arm-NAME.xz, the B side of an
#        A/B in one call (`run.sh --decode-bench ARM=NAME`; check out the variant, pack it, return, then prebuild).
#        bash tools/device/prebuild.sh --bench: magnetar only (~8 MB instead of ~17), for a call that runs only the bench
#        modes: with an arm or two it still fits the carry.
# Then call the device with carry=["build-prebuilt", ".device-deps"]: run.sh unpacks build-prebuilt/prebuilt.tar.xz
# into build-cuda/ there and uses its binaries when their source hash (tools/device/source_hash.sh) matches the tree it
# was sent with and they load; otherwise it builds as usual. Packed: magnetar, magnetar_cuda_tests,
# magnetar_golden_tests (stripped) and the ctest files, so `run.sh '^none$' REGEX` runs ctest over them and the bench
# modes run the packed magnetar. Uses build-cuda/ (Release, CUDA for sm_90, tests on; configured if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/device/source_hash.sh
dir=build-cuda
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAGNETAR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DMAGNETAR_TESTS=ON -DMAGNETAR_BENCH=OFF >/dev/null
fi
grep -q '^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=90$' "$dir/CMakeCache.txt" ||
  { echo "prebuild: $dir is not configured for sm_90 (CMAKE_CUDA_ARCHITECTURES=90)" >&2; exit 1; }
grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$dir/CMakeCache.txt" ||
  { echo "prebuild: $dir is not a Release build" >&2; exit 1; }
if [ "${1:-}" = "--arm" ]; then
  [ -n "${2:-}" ] || { echo "prebuild: --arm needs a name" >&2; exit 1; }
  cmake --build "$dir" -j "$(nproc)" --target magnetar
  mkdir -p build-prebuilt
  strip -o "build-prebuilt/arm-$2" "$dir/tools/magnetar" && xz -f "build-prebuilt/arm-$2"
  echo "prebuild: build-prebuilt/arm-$2.xz ($(du -h "build-prebuilt/arm-$2.xz" | cut -f1)); run.sh arm ARM=$2"
  exit 0
fi
hash=$(source_hash)
binaries=(tools/magnetar tests/magnetar_cuda_tests tests/magnetar_golden_tests)
[ "${1:-}" = "--bench" ] && binaries=(tools/magnetar)
cmake --build "$dir" -j "$(nproc)" --target "${binaries[@]##*/}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for b in "${binaries[@]}"; do
  mkdir -p "$stage/$dir/$(dirname "$b")"
  strip -o "$stage/$dir/$b" "$dir/$b"
done
# ctest's files (absolute paths: the device's copy of the tree sits at the same path as this one)
(cd "$dir" && find . -name CTestTestfile.cmake -o -path './tests/*_include.cmake' -o -path './tests/*_tests.cmake') |
  while read -r f; do mkdir -p "$stage/$dir/$(dirname "$f")" && cp "$dir/$f" "$stage/$dir/$f"; done
echo "$hash" >"$stage/$dir/prebuilt.sum"
mkdir -p build-prebuilt
tar -C "$stage" -cJf build-prebuilt/prebuilt.tar.xz "$dir"
echo "prebuild: build-prebuilt/prebuilt.tar.xz ($(du -h build-prebuilt/prebuilt.tar.xz | cut -f1), sources $hash);" \
  "carry [\"build-prebuilt\", \".device-deps\"]"
