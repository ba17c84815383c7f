#!/usr/bin/env bash
# Installs Magnetar's build and test dependencies from Debian packages. Idempotent: installs only what is
# missing, so `make test` on a machine that already has everything does no network I/O.
set -euo pipefail

packages=(
  cmake g++ make ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev liburing-dev libpcre2-dev libcpp-httplib-dev
  clang-format clang-tidy
  python3 python3-jinja2  # the chat template parity test's reference (tests/chat/jinja_reference.py)
  chromium  # the web UI's browser test (tests/webui/, through playwright-core from npm) drives /usr/bin/chromium
)
# `scripts/setup.sh fuzz`: also clang++ with libFuzzer (make fuzz)
if [ "${1:-}" = "fuzz" ]; then
  packages+=(clang libclang-rt-dev)
fi

missing=()
# node + npm run the tokenizer parity test's reference (HF tokenizers through npm); any install will do
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
