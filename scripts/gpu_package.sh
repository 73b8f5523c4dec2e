#!/usr/bin/env bash
# Builds the CUDA binaries here (sm_90a) and packs what scripts/gpu_run.sh needs
# into .devrun/ (git-ignored via .git/info/exclude), for a GPU machine without
# our Debian packages.
# Usage: scripts/gpu_package.sh [BUILD_DIR (build-cuda)]; MERE_DEVRUN names the
# pack (default .devrun), so several people can keep their own.
# To benchmark several builds in one call, pack them with scripts/gpu_ab_pack.sh instead.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
pack=${MERE_DEVRUN:-.devrun}
cmake -S . -B "$build" -G Ninja -DMERE_CUDA=ON >/dev/null
cmake --build "$build"
rm -rf "$pack" && mkdir -p "$pack"
# Compressed: the carried pack must stay under the device's 64 MiB transfer limit. xz -9e's
# large window finds the code the two binaries share (half the size of plain -J).
tar -cf - -C "$build" mere -C "$PWD/$build/tests" mere_gpu_tests | xz -9e -T0 > "$pack/bin.tar.xz"
# The CUPTI kernel tracer (tools/kernel_timeline.cpp) for `gpu_run.sh timeline`.
g++ -std=c++20 -O2 -shared -fPIC -I/usr/local/cuda/include tools/kernel_timeline.cpp \
  -L/usr/local/cuda/lib64 -lcupti -o "$pack/kernel_timeline.so"
pwd > "$pack/source_dir"
echo "$build" > "$pack/build_dir"  # where the tests look for the mere binary (MERE_BINARY)
libs=$(ldd "$build/mere" | awk '/libfmt|libpcre2|libicu/ {print $3}')
tar -cJhf "$pack/libs.tar.xz" -C / $(for l in $libs; do echo "${l#/}"; done) --transform 's|.*/||'
grep -qs '^/.devrun\*/' .git/info/exclude || echo "/.devrun*/" >> .git/info/exclude
du -sh "$pack"
