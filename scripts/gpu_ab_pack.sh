#!/usr/bin/env bash
# Packs several builds of `mere` for one A/B benchmark call on the GPU machine, within
# the device's 64 MiB transfer limit (the repository's tracked files take about 38 MB).
# Each binary is stripped; all go into one xz archive, whose window finds the code the
# builds share (two builds of one day: about 21 MB). The shared libraries are
# gpu_package.sh's, with ICU's 31 MB data library replaced by a stub that only
# satisfies the loader: `mere bench` on random weights never reads ICU's data, but
# anything that tokenizes would, so run tests from the full pack (.devrun), not this one.
# Usage: scripts/gpu_ab_pack.sh NAME=PATH [NAME=PATH ...]   (e.g. head=/tmp/head/mere)
# On the GPU machine (carry .devrun_ab):
#   mkdir -p /tmp/ab/libs && tar -C /tmp/ab -xJf .devrun_ab/bins.tar.xz &&
#   tar -C /tmp/ab/libs -xJf .devrun_ab/libs.tar.xz &&
#   LD_LIBRARY_PATH=/tmp/ab/libs:/usr/local/cuda/lib64 /tmp/ab/mere_NAME bench ...
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
pack=.devrun_ab
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bins" "$work/libs" "$pack"
for arg in "$@"; do
  name=${arg%%=*} path=${arg#*=}
  [ -x "$path" ] || { echo "$path: not an executable" >&2; exit 1; }
  cp "$path" "$work/bins/mere_$name" && strip "$work/bins/mere_$name"
done
tar -C "$work/bins" -cf - . | xz -9e -T0 > "$pack/bins.tar.xz"
first=${1#*=}
for lib in $(ldd "$first" | awk '/libfmt|libpcre2|libicuuc/ {print $3}'); do cp -L "$lib" "$work/libs/"; done
data=$(ldd "$first" | awk '/libicudata/ {print $1}')
if [ -n "$data" ]; then
  symbol=$(nm -D "$(ldd "$first" | awk '/libicudata/ {print $3}')" | awk '/ R icudt/ {print $3}')
  echo "const char ${symbol}[64] __attribute__((aligned(16))) = {0};" > "$work/stub.c"
  gcc -shared -fPIC -Wl,-soname,"$data" -o "$work/libs/$data" "$work/stub.c"
fi
tar -C "$work/libs" -cf - . | xz -9e > "$pack/libs.tar.xz"
grep -qs '^/.devrun\*/' .git/info/exclude || echo "/.devrun*/" >> .git/info/exclude
du -sh "$pack"/*
