#!/usr/bin/env bash
# clang-format (check only) and clang-tidy over the tracked C++ sources. Usage: scripts/lint.sh BUILD_DIR
# (the build dir provides compile_commands.json). Exit status is non-zero when either tool finds something.
set -uo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
status=0
mapfile -t files < <(git ls-files '*.cpp' '*.h' | grep -v '^tests/fuzz/')
echo "lint: clang-format on ${#files[@]} files"
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/magnetar-format.txt; then
  grep -c 'warning:' /tmp/magnetar-format.txt | xargs echo "lint: clang-format differences:"
  head -20 /tmp/magnetar-format.txt
  status=1
fi
mapfile -t sources < <(git ls-files '*.cpp' | grep -v '^tests/fuzz/')
echo "lint: clang-tidy on ${#sources[@]} files"
if ! clang-tidy -p "$build" --quiet "${sources[@]}" >/tmp/magnetar-tidy.txt 2>/dev/null; then status=1; fi
if grep -q 'warning:' /tmp/magnetar-tidy.txt; then
  grep 'warning:' /tmp/magnetar-tidy.txt | sort -u | head -40
  status=1
fi
[ $status -eq 0 ] && echo "lint: clean"
exit $status
