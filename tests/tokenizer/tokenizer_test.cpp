// Tokenizer units: lossy UTF-8, added-token flags, streaming decode, load errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "tokenizer/unicode.h"
#include "tokenizer_cache.h"

namespace mere {
namespace {

using nlohmann::json;

const std::string kFffd = "\xEF\xBF\xBD";

TEST(TokenizerUnicode, LossyUtf8MatchesRust) {
  // Rust's String::from_utf8_lossy: one U+FFFD per maximal invalid subsequence.
  EXPECT_EQ(unicode::utf8_lossy("Hello \xF0\x90\x80World"), "Hello " + kFffd + "World");
  EXPECT_EQ(unicode::utf8_lossy("\xC0\x80"), kFffd + kFffd);          // overlong
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(unicode::utf8_lossy("\xE2\x82" "A"), kFffd + "A");
  EXPECT_EQ(unicode::utf8_lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(unicode::utf8_lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
  EXPECT_FALSE(unicode::find_invalid_utf8("ok \xF0\x9F\x98\x80").has_value());
  EXPECT_EQ(unicode::find_invalid_utf8("ok \xF0\x9F\x98"), 3u);
}

TEST(TokenizerUnicode, Nfc) {
  EXPECT_EQ(unicode::normalize("e\xCC\x81", unicode::NormalForm::nfc), "\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xE2\x84\xAB", unicode::NormalForm::nfc), "\xC3\x85");  // Å sign
  EXPECT_EQ(unicode::normalize("plain", unicode::NormalForm::nfc), "plain");
}

// A character-level BPE over printable ASCII, with `added` as its added_tokens.
json char_tokenizer(json added) {
  json vocab = json::object();
  for (int c = 0x20; c < 0x7F; ++c) vocab[std::string(1, char(c))] = c;
  vocab["\t"] = 9;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
          {"added_tokens", added}};
}

std::vector<int32_t> chars(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST(TokenizerAddedTokens, SingleWordAndStrip) {
  // The cases of tokenizers' added_vocabulary.rs tests, without their Lowercase normalizer.
  json mask = {{"id", 500}, {"content", "<mask>"}, {"single_word", true}, {"lstrip", false},
               {"rstrip", false}, {"normalized", false}, {"special", false}};
  Tokenizer single = Tokenizer::from_json(char_tokenizer(json::array({mask})).dump());
  EXPECT_EQ(single.encode("<mask> My name <mask> A<mask> <mask>ony <mask>"),
            concat({{500}, chars(" My name "), {500}, chars(" A<mask> <mask>ony "), {500}}));

  mask["lstrip"] = true;
  mask["rstrip"] = true;
  Tokenizer strip = Tokenizer::from_json(char_tokenizer(json::array({mask})).dump());
  EXPECT_EQ(strip.encode("Hi <mask> there\t<mask>\t<mask>\u2000"),
            concat({chars("Hi"), {500}, chars("there"), {500}, {500}}));
  EXPECT_EQ(strip.decode({500}), "<mask>");
  EXPECT_FALSE(strip.is_special(500));
}

TEST(TokenizerAddedTokens, LeftmostLongest) {
  json added = json::array();
  int id = 600;
  for (const char* content : {"<a>", "<a><b>", "b>"}) {
    added.push_back({{"id", id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  Tokenizer tok = Tokenizer::from_json(char_tokenizer(added).dump());
  EXPECT_EQ(tok.encode("x<a><b>y<a>b>"), concat({chars("x"), {601}, chars("y"), {600, 602}}));
  EXPECT_EQ(tok.decode({601, 'z'}, /*skip_special_tokens=*/true), "z");
  EXPECT_TRUE(tok.is_special(600));
  EXPECT_EQ(tok.vocab_size(), 0x7F - 0x20 + 1 + 3);
}

// Feeds ids one at a time; every chunk must be valid UTF-8 and all of them the full decode.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder decoder(tok);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(decoder.push(id));
  chunks.push_back(decoder.flush());
  return chunks;
}

TEST(TokenizerStream, ByteFallbackEmojiWaitsForAllBytes) {
  const Tokenizer& tok = test::cached_tokenizer("llama2");
  std::vector<int32_t> ids = tok.encode("a🫠b");  // U+1FAE0 is not in the vocab: 4 bytes
  std::vector<int32_t> bytes;
  for (unsigned char c : std::string("🫠")) bytes.push_back(*tok.token_to_id(fmt::format("<0x{:02X}>", c)));
  ASSERT_NE(std::search(ids.begin(), ids.end(), bytes.begin(), bytes.end()), ids.end())
      << "expected the emoji as four byte-fallback tokens";
  std::vector<std::string> chunks = stream(tok, ids);
  std::string all;
  for (const std::string& c : chunks) {
    EXPECT_FALSE(unicode::find_invalid_utf8(c).has_value());
    EXPECT_EQ(c.find(kFffd), std::string::npos) << "emitted a partial character";
    all += c;
  }
  EXPECT_EQ(all, "a🫠b");
  EXPECT_EQ(all, tok.decode(ids));
}

TEST(TokenizerStream, ByteLevelSplitCharacters) {
  const Tokenizer& tok = test::cached_tokenizer("qwen3");
  // Rare characters are split over several byte-level tokens.
  std::string text = "🫠🧑🏽‍🚀 𠀀𪜀 ok";
  std::vector<int32_t> ids = tok.encode(text);
  std::string all;
  for (const std::string& c : stream(tok, ids)) {
    EXPECT_EQ(c.find(kFffd), std::string::npos) << "emitted a partial character";
    all += c;
  }
  EXPECT_EQ(all, text);

  StreamDecoder partial(tok);
  std::string held;
  for (int32_t id : tok.encode("🫠")) held += partial.push(id);
  EXPECT_EQ(held + partial.flush(), "🫠");
  EXPECT_EQ(partial.push(tok.encode("x")[0]), "x");  // flush resets
}

TEST(TokenizerStream, WholeCorpusEveryTokenizer) {
  for (const std::string& name : test::tokenizer_names()) {
    const Tokenizer& tok = test::cached_tokenizer(name);
    int mismatches = 0;
    for (const std::string& text : test::tokenizer_corpus()) {
      std::vector<int32_t> ids = tok.encode(text, true);
      std::string all;
      for (const std::string& c : stream(tok, ids)) {
        EXPECT_FALSE(unicode::find_invalid_utf8(c).has_value());
        all += c;
      }
      if (all != tok.decode(ids) && mismatches++ < 3)
        ADD_FAILURE() << name << ": streamed text differs from decode for " << json(text).dump();
    }
  }
}

// Writes `content` as tokenizer.json in a fresh directory and returns the load error.
std::string load_error(const std::string& content) {
  auto dir = test::temp_dir("tok");
  test::write_file(dir / "tokenizer.json", content);
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerErrors, NameTheFileAndTheProblem) {
  EXPECT_TRUE(test::contains(load_error("{\"model\": "), "tokenizer.json"));
  EXPECT_TRUE(test::contains(load_error("{\"model\": "), "parse"));

  json unigram = {{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}};
  std::string e = load_error(unigram.dump());
  EXPECT_TRUE(test::contains(e, "tokenizer.json"));
  EXPECT_TRUE(test::contains(e, "model type 'Unigram' is not supported"));

  json tok = char_tokenizer(json::array());
  tok["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_TRUE(test::contains(load_error(tok.dump()), "pre_tokenizer type 'BertPreTokenizer'"));

  tok = char_tokenizer(json::array());
  tok["model"]["merges"] = json::array({"a zz"});
  EXPECT_TRUE(test::contains(load_error(tok.dump()), "model.merges[0]: 'zz' is not in model.vocab"));

  tok = char_tokenizer(json::array());
  tok["decoder"] = {{"type", "WordPiece"}};
  EXPECT_TRUE(test::contains(load_error(tok.dump()), "decoder type 'WordPiece'"));

  try {
    Tokenizer::load("/nonexistent/tok");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(std::string(e.what()), "/nonexistent/tok"));
  }
}

// Sequences of components nest; nested without end they are an error, not a stack overflow
// (each of the four crashed at 100,000 levels before the bound). A few levels still load.
TEST(TokenizerErrors, SequencesNestedWithoutEnd) {
  const std::pair<const char*, const char*> components[] = {
      {"normalizer", "normalizers"}, {"pre_tokenizer", "pretokenizers"}, {"decoder", "decoders"},
      {"post_processor", "processors"}};
  const json leaf = {{"normalizer", {{"type", "NFC"}}},
                     {"pre_tokenizer", {{"type", "Whitespace"}}},
                     {"decoder", {{"type", "Fuse"}}},
                     {"post_processor", {{"type", "ByteLevel"}}}};
  for (const auto& [component, list] : components) {
    SCOPED_TRACE(component);
    auto nested = [&](int levels) {
      // Built as text: nlohmann's own recursion would not take 100,000 levels of objects.
      std::string open, close;
      for (int i = 0; i < levels; ++i) {
        open += std::string("{\"type\": \"Sequence\", \"") + list + "\": [";
        close += "]}";
      }
      json tok = char_tokenizer(json::array());
      tok[component] = "@nested@";
      std::string text = tok.dump();
      return text.replace(text.find("\"@nested@\""), 10, open + leaf[component].dump() + close);
    };
    EXPECT_EQ(load_error(nested(3)), "(no error)");
    const std::string e = load_error(nested(100000));
    EXPECT_TRUE(test::contains(e, "tokenizer.json")) << e;
    EXPECT_TRUE(test::contains(e, "Sequences nested more than 32 deep")) << e;
  }
}

TEST(TokenizerErrors, InvalidUtf8Input) {
  Tokenizer tok = Tokenizer::from_json(char_tokenizer(json::array()).dump());
  EXPECT_THROW(tok.encode("ab\xFF"), Error);
  EXPECT_THROW(tok.id_to_token(100000), Error);
  // Unknown ids are dropped, as tokenizers does; without a decoder, tokens join with spaces.
  EXPECT_EQ(tok.decode({'a', 100000, 'b'}), "a b");
}

TEST(TokenizerConfig, BosEos) {
  const Tokenizer& llama3 = test::cached_tokenizer("llama3");
  EXPECT_EQ(llama3.bos_id(), llama3.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3.eos_id(), llama3.token_to_id("<|end_of_text|>"));
  const Tokenizer& qwen3 = test::cached_tokenizer("qwen3");
  EXPECT_EQ(qwen3.bos_id(), std::nullopt);  // bos_token: null
  EXPECT_EQ(qwen3.eos_id(), 151645);        // <|im_end|>
  const Tokenizer& deepseek = test::cached_tokenizer("deepseek_v3");  // {"content": ...} form
  EXPECT_EQ(deepseek.bos_id(), deepseek.token_to_id("<｜begin▁of▁sentence｜>"));
  EXPECT_TRUE(deepseek.is_special(*deepseek.bos_id()));
  EXPECT_EQ(qwen3.id_to_token(9707), "Hello");
}

}  // namespace
}  // namespace mere
