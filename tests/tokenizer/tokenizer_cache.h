// The six real tokenizers fetched by scripts/fetch_tokenizers.sh, each loaded once per test
// binary (a tokenizer.json takes up to ~1.5 s to parse), plus their reference fixtures.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mere::test {

inline const std::vector<std::string>& tokenizer_names() {
  static const std::vector<std::string> names = {"qwen3",       "llama3", "llama2",
                                                 "deepseek_v3", "gemma3", "gptoss"};
  return names;
}

inline std::filesystem::path tokenizer_dir(const std::string& name) {
  return source_dir() / "third_party" / "npm" / name;
}

// Throws (failing the test, not skipping it) when the files were not fetched.
inline const Tokenizer& cached_tokenizer(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[name];
  if (!slot) {
    auto dir = tokenizer_dir(name);
    MERE_CHECK(std::filesystem::exists(dir / "tokenizer.json"),
               "{} is missing: run scripts/setup.sh (it fetches the tokenizer files with "
               "scripts/fetch_tokenizers.sh)",
               (dir / "tokenizer.json").string());
    slot = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  }
  return *slot;
}

inline const std::vector<std::string>& tokenizer_corpus() {
  static const std::vector<std::string> corpus =
      read_json(source_dir() / "tests" / "tokenizer" / "corpus.json").get<std::vector<std::string>>();
  return corpus;
}

// EXPECT_TRUE(contains(error_text, "expected part")), with both shown on failure.
inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// tests/tokenizer/refs/<name>.json, written by scripts/make_tokenizer_refs.py.
inline nlohmann::json tokenizer_refs(const std::string& name) {
  return read_json(source_dir() / "tests" / "tokenizer" / "refs" / (name + ".json"));
}

}  // namespace mere::test
