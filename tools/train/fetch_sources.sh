#!/usr/bin/env bash
# Downloads the Debian packages the demo model's corpus is made from and unpacks them with dpkg-deb -x.
# Nothing is installed: the .debs land in DIR/debs, their files under DIR/root (default DIR: build/corpus-debs,
# which git ignores). Then: python3 tools/train/make_corpus.py (tools/train/README.md).
#
#   bible-kjv-text  the King James Bible (compressed; read with bible-kjv's `bible` program, run from DIR/root)
#   bible-kjv       that program (a tool only: none of its files go into the corpus)
#   dict-gcide      GCIDE, the Collaborative International Dictionary of English (dictd format)
#   fortunes-min, fortunes   fortune cookies (fortunes-off, the offensive set, is never fetched)
#   python3.11-doc  the Python 3.11 documentation (what Debian 12's python3-doc depends on); its info file is used
#   manpages, manpages-dev   the Linux man-pages project (sections 1-8; groff renders them)
#
# Usage: tools/train/fetch_sources.sh [DIR]
set -euo pipefail

dir=${1:-build/corpus-debs}
packages=(bible-kjv-text bible-kjv dict-gcide fortunes-min fortunes python3.11-doc manpages manpages-dev)

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "fetch_sources.sh: $tool not found (Debian or Ubuntu needed)" >&2; exit 2; }
done

mkdir -p "$dir/debs"
rm -rf "$dir/root"
mkdir -p "$dir/root"
cd "$dir/debs"
rm -f ./*.deb
# apt-get download runs as the caller; as root it warns that _apt cannot write here, which is harmless.
if ! apt-get download "${packages[@]}"; then
  if [ "$(id -u)" = 0 ]; then
    echo "fetch_sources.sh: download failed; running apt-get update and trying again" >&2
    apt-get update
    apt-get download "${packages[@]}"
  else
    echo "fetch_sources.sh: apt-get download failed; run 'sudo apt-get update' and try again" >&2
    exit 1
  fi
fi
for deb in ./*.deb; do
  dpkg-deb -x "$deb" ../root
done
printf '%s\n' ./*.deb | sed 's|^\./||' >../debs.txt
echo "fetch_sources.sh: $(wc -l <../debs.txt) packages unpacked under $dir/root"
