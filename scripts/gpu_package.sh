#!/usr/bin/env bash
# Builds the CUDA binaries here (sm_90a) and packs what scripts/gpu_run.sh needs
# into .devrun/ (git-ignored via .git/info/exclude), for a GPU machine without
# our Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -G Ninja -DMERE_CUDA=ON >/dev/null
cmake --build build-cuda
rm -rf .devrun && mkdir -p .devrun
cp build-cuda/mere build-cuda/tests/mere_gpu_tests .devrun/
pwd > .devrun/source_dir
libs=$(ldd build-cuda/mere | awk '/libfmt|libpcre2|libicu/ {print $3}')
tar -cJhf .devrun/libs.tar.xz -C / $(for l in $libs; do echo "${l#/}"; done) --transform 's|.*/||'
grep -qs '^/.devrun/' .git/info/exclude || echo "/.devrun/" >> .git/info/exclude
du -sh .devrun
