// Parity with Hugging Face `tokenizers` on six real tokenizer.json files: the ids of every
// corpus text with and without special tokens, and decode, against the fixtures of
// scripts/make_tokenizer_refs.py (tests/tokenizer/refs/).
#include <gtest/gtest.h>

#include <cstdio>

#include "tokenizer_cache.h"

namespace mere {
namespace {

using nlohmann::json;

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, MatchesTokenizersLibrary) {
  const std::string name = GetParam();
  const Tokenizer& tok = test::cached_tokenizer(name);
  const auto& corpus = test::tokenizer_corpus();
  json refs = test::tokenizer_refs(name);
  ASSERT_EQ(refs["cases"].size(), corpus.size())
      << "refs/" << name << ".json is stale: rerun scripts/make_tokenizer_refs.py";
  EXPECT_EQ(tok.vocab_size(), refs["vocab_size"].get<int32_t>());

  int ok_plain = 0, ok_special = 0, ok_decode = 0, reported = 0;
  auto report = [&](const std::string& what, size_t i, const std::string& got, const std::string& want) {
    if (reported++ < 8)
      ADD_FAILURE() << name << " " << what << " of text " << i << " " << show(corpus[i]).substr(0, 200)
                    << "\n  got:  " << got.substr(0, 400) << "\n  want: " << want.substr(0, 400);
  };
  for (size_t i = 0; i < corpus.size(); ++i) {
    const json& c = refs["cases"][i];
    auto want = c["ids"].get<std::vector<int32_t>>();
    auto want_special = c.value("ids_special", want);
    auto got = tok.encode(corpus[i], false);
    auto got_special = tok.encode(corpus[i], true);
    if (got == want)
      ++ok_plain;
    else
      report("encode", i, json(got).dump(), json(want).dump());
    if (got_special == want_special)
      ++ok_special;
    else
      report("encode+special", i, json(got_special).dump(), json(want_special).dump());

    bool decode_ok = true;
    auto check = [&](const char* what, const std::vector<int32_t>& ids, bool skip, const char* key) {
      if (!c.contains(key)) return;
      std::string text = tok.decode(ids, skip);
      std::string expected = c[key].get<std::string>();
      if (text != expected) {
        decode_ok = false;
        report(what, i, show(text), show(expected));
      }
    };
    check("decode", want, false, "decoded");
    check("decode skip_special", want, true, "decoded_skip");
    check("decode+special", want_special, false, "decoded_special");
    check("decode+special skip_special", want_special, true, "decoded_special_skip");
    ok_decode += decode_ok;
  }

  int ok_random = 0;
  const json& decodes = refs["decodes"];
  for (size_t i = 0; i < decodes.size(); ++i) {
    auto ids = decodes[i]["ids"].get<std::vector<int32_t>>();
    std::string got = tok.decode(ids, false), got_skip = tok.decode(ids, true);
    std::string want = decodes[i]["decoded"], want_skip = decodes[i]["decoded_skip"];
    if (got == want && got_skip == want_skip) {
      ++ok_random;
    } else if (reported++ < 8) {
      ADD_FAILURE() << name << " decode of ids " << json(ids).dump() << "\n  got:  " << show(got)
                    << " / " << show(got_skip) << "\n  want: " << show(want) << " / " << show(want_skip);
    }
  }

  size_t n = corpus.size();
  std::printf("%s: %d/%zu encode, %d/%zu encode+special, %d/%zu decode, %d/%zu decode of id sequences\n",
              name.c_str(), ok_plain, n, ok_special, n, ok_decode, n, ok_random, decodes.size());
  EXPECT_EQ(ok_plain, int(n));
  EXPECT_EQ(ok_special, int(n));
  EXPECT_EQ(ok_decode, int(n));
  EXPECT_EQ(ok_random, int(decodes.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerParity, ::testing::ValuesIn(test::tokenizer_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mere
