#!/usr/bin/env bash
# Lays the output of train.py (--out DIR, or the tar of it) out as models/demo/:
# the main model's files at the top, the draft's in draft/, plus the evaluation files.
# Usage: scripts/train_demo/install.sh DIR [train.log]
set -euo pipefail
src=$1; log=${2:-}
dst=$(cd "$(dirname "$0")/../.." && pwd)/models/demo
mkdir -p "$dst/draft"
cp "$src"/main/{config.json,model.safetensors,generation_config.json,tokenizer.json,tokenizer_config.json} "$dst/"
cp "$src"/draft/{config.json,model.safetensors,generation_config.json,tokenizer.json,tokenizer_config.json} "$dst/draft/"
cp "$src"/{loss.png,reference.json,heldout.txt,heldout_test.txt} "$dst/"
cp /usr/lib/python3.11/LICENSE.txt "$dst/LICENSE-Python.txt"
[ -n "$log" ] && cp "$log" "$dst/train.log"
chmod 644 "$dst"/*.* "$dst"/draft/*
total=$(find "$dst" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
echo "models/demo: $total bytes"
[ "$total" -le 33554432 ] || { echo "over the 32 MiB limit" >&2; exit 1; }
