#!/usr/bin/env bash
# Builds the CUDA binaries here (sm_90a) and packs what scripts/gpu_run.sh needs
# into .devrun/ (git-ignored via .git/info/exclude), for a GPU machine without
# our Debian packages.
# Usage: scripts/gpu_package.sh [BUILD_DIR (build-cuda)]; MERE_DEVRUN names the
# pack (default .devrun), so several people can keep their own.
# To benchmark several builds in one call, pack them with scripts/gpu_ab_pack.sh instead.
# Without PTX in the binaries (sm_90a machine code only, since the fifty-ninth
# session) one pack of both is about 17 MB and fits beside the working tree
# (39 MB) in the device's 64 MiB carry. MERE_PACK_SPLIT=1 still makes two packs
# instead, PACK-bench (mere, the tracer) and PACK-tests (mere_gpu_tests), for
# when it does not: carry the bench pack first, as the tests that run the CLI
# find its mere on the same warm machine.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
pack=${MERE_DEVRUN:-.devrun}
cmake -S . -B "$build" -G Ninja -DMERE_CUDA=ON >/dev/null
cmake --build "$build"
libs=$(ldd "$build/mere" | awk '/libfmt|libpcre2|libicu/ {print $3}')
# make_pack DIR FILE...: the binaries (paths under $build) compressed, the libraries, and where they were built.
make_pack() {
  local dir=$1; shift
  rm -rf "$dir" && mkdir -p "$dir"
  # Compressed: the carried pack must stay under the device's 64 MiB transfer limit. xz -9e's
  # large window finds the code the two binaries share (half the size of plain -J).
  # Stripped copies: the symbols take room the carry does not have.
  local stripped
  stripped=$(mktemp -d)
  for f in "$@"; do cp "$build/$f" "$stripped/" && strip "$stripped/$(basename "$f")"; done
  tar -cf - -C "$stripped" $(for f in "$@"; do basename "$f"; done) | xz -9e -T0 > "$dir/bin.tar.xz"
  rm -rf "$stripped"
  pwd > "$dir/source_dir"
  echo "$build" > "$dir/build_dir"  # where the tests look for the mere binary (MERE_BINARY)
  tar -cJhf "$dir/libs.tar.xz" -C / $(for l in $libs; do echo "${l#/}"; done) --transform 's|.*/||'
}
# The CUPTI kernel tracer (tools/kernel_timeline.cpp) for `gpu_run.sh timeline`.
tracer() {
  g++ -std=c++20 -O2 -shared -fPIC -I/usr/local/cuda/include tools/kernel_timeline.cpp \
    -L/usr/local/cuda/lib64 -lcupti -o "$1/kernel_timeline.so"
}
if [ -n "${MERE_PACK_SPLIT:-}" ]; then
  make_pack "$pack-bench" mere && tracer "$pack-bench"
  make_pack "$pack-tests" tests/mere_gpu_tests
  du -sh "$pack-bench" "$pack-tests"
else
  make_pack "$pack" mere tests/mere_gpu_tests && tracer "$pack"
  du -sh "$pack"
fi
grep -qs '^/.devrun\*/' .git/info/exclude || echo "/.devrun*/" >> .git/info/exclude
