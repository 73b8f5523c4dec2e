#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace mere {

using tokenizer_json::Json;

// truncation and padding in tokenizer.json are not read: mere encodes whole texts, one at a time.
struct Tokenizer::Impl {
  Bpe model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;

  std::vector<AddedToken> added;
  std::unordered_map<int32_t, int32_t> added_by_id;  // id -> index in `added`
  TokenMap added_by_content;                          // content -> id
  std::unordered_set<std::string> special_contents;
  AddedTokenMatcher raw_matcher;         // tokens with normalized = false, on the input text
  AddedTokenMatcher normalized_matcher;  // the others, on normalized text
  int32_t vocab_size = 0;
  std::optional<int32_t> bos, eos;

  const std::string* token_of(int32_t id) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
    return model.id_to_token(id);
  }
};

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MERE_CHECK(in.good(), "tokenizer: cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<AddedToken> parse_added_tokens(const Json& j) {
  std::vector<AddedToken> tokens;
  if (j.is_null()) return tokens;
  MERE_CHECK(j.is_array(), "added_tokens: expected an array, got {}", j.type_name());
  for (size_t k = 0; k < j.size(); ++k) {
    const Json& t = j[k];
    const std::string where = fmt::format("added_tokens[{}]", k);
    AddedToken a;
    a.content = tokenizer_json::get<std::string>(t, "content", where);
    a.id = tokenizer_json::get<int32_t>(t, "id", where);
    MERE_CHECK(a.id >= 0, "{}: negative id {}", where, a.id);
    a.special = tokenizer_json::get_or<bool>(t, "special", false, where);
    a.single_word = tokenizer_json::get_or<bool>(t, "single_word", false, where);
    a.lstrip = tokenizer_json::get_or<bool>(t, "lstrip", false, where);
    a.rstrip = tokenizer_json::get_or<bool>(t, "rstrip", false, where);
    a.normalized = tokenizer_json::get_or<bool>(t, "normalized", !a.special, where);
    if (!a.content.empty()) tokens.push_back(std::move(a));
  }
  return tokens;
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...} or null.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: expected a string, {{\"content\": ...}} or null, got {}", key, it->dump());
}

std::shared_ptr<Tokenizer::Impl> build(const Json& j) {
  auto t = std::make_shared<Tokenizer::Impl>();
  MERE_CHECK(j.is_object(), "expected a JSON object at the top, got {}", j.type_name());
  const Json& model = tokenizer_json::require(j, "model", "tokenizer");
  std::string type = model.contains("type") ? tokenizer_json::type_of(model, "model")
                                            : (model.contains("merges") ? "BPE" : "");
  MERE_CHECK(type == "BPE", "model type '{}' is not supported (supported: BPE)", type);
  t->model = Bpe::from_json(model);

  auto component = [&](const char* key) -> const Json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* c = component("normalizer")) t->normalizer = make_normalizer(*c);
  if (const Json* c = component("pre_tokenizer")) t->pre_tokenizer = make_pre_tokenizer(*c);
  if (const Json* c = component("post_processor")) t->post_processor = make_post_processor(*c);
  if (const Json* c = component("decoder")) t->decoder = make_decoder(*c);

  t->added = parse_added_tokens(j.contains("added_tokens") ? j["added_tokens"] : Json());
  std::vector<int32_t> raw_indices, normalized_indices;
  std::vector<std::string> raw_patterns, normalized_patterns;
  // Special tokens come first in the matchers, as in tokenizers (only matters for duplicates).
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t k = 0; k < static_cast<int32_t>(t->added.size()); ++k) {
      const AddedToken& a = t->added[k];
      if (a.special != (pass == 0)) continue;
      if (a.normalized) {
        normalized_indices.push_back(k);
        normalized_patterns.push_back(t->normalizer ? t->normalizer->normalize(a.content)
                                                    : a.content);
      } else {
        raw_indices.push_back(k);
        raw_patterns.push_back(a.content);
      }
    }
  }
  int32_t extra = 0;
  for (int32_t k = 0; k < static_cast<int32_t>(t->added.size()); ++k) {
    const AddedToken& a = t->added[k];
    t->added_by_id[a.id] = k;
    if (t->added_by_content.emplace(a.content, a.id).second && !t->model.token_to_id(a.content))
      ++extra;
    if (a.special) t->special_contents.insert(a.content);
  }
  t->vocab_size = static_cast<int32_t>(t->model.vocab().size()) + extra;
  t->raw_matcher = AddedTokenMatcher(&t->added, raw_indices, raw_patterns);
  t->normalized_matcher = AddedTokenMatcher(&t->added, normalized_indices, normalized_patterns);
  return t;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& name) {
  Tokenizer tok;
  try {
    Json j = Json::parse(text);
    tok.impl_ = build(j);
  } catch (const Json::exception& e) {
    fail("{}: {}", name, e.what());
  } catch (const Error& e) {
    fail("{}: {}", name, e.what());
  }
  return tok;
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path file = fs::is_directory(dir_or_file) ? dir_or_file / "tokenizer.json" : dir_or_file;
  MERE_CHECK(fs::exists(file), "tokenizer: {} does not exist", file.string());
  Tokenizer tok = from_json(read_text(file), file.string());

  fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (!fs::exists(config_file)) return tok;
  auto impl = std::const_pointer_cast<Impl>(tok.impl_);
  try {
    Json config = Json::parse(read_text(config_file));
    auto resolve = [&](const char* key) -> std::optional<int32_t> {
      std::optional<std::string> name = config_token(config, key);
      if (!name) return std::nullopt;
      std::optional<int32_t> id = tok.token_to_id(*name);
      MERE_CHECK(id.has_value(), "{} '{}' is not in the vocabulary of {}", key, *name,
                 file.string());
      return id;
    };
    impl->bos = resolve("bos_token");
    impl->eos = resolve("eos_token");
  } catch (const Json::exception& e) {
    fail("{}: {}", config_file.string(), e.what());
  } catch (const Error& e) {
    fail("{}: {}", config_file.string(), e.what());
  }
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (auto bad = unicode::find_invalid_utf8(text))
    fail("tokenizer: cannot encode text that is not valid UTF-8 (byte {} of {})", *bad,
         text.size());
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  std::vector<Piece> pieces;
  for (const Segment& raw : t.raw_matcher.split(text)) {
    if (raw.token >= 0) {
      ids.push_back(t.added[raw.token].id);
      continue;
    }
    // Each stretch between added tokens is normalized on its own, as in tokenizers.
    std::string normalized(text.substr(raw.begin, raw.end - raw.begin));
    if (t.normalizer) normalized = t.normalizer->normalize(std::move(normalized));
    for (const Segment& seg : t.normalized_matcher.split(normalized)) {
      if (seg.token >= 0) {
        ids.push_back(t.added[seg.token].id);
        continue;
      }
      if (seg.end == seg.begin) continue;
      pieces.assign(1, Piece{normalized.substr(seg.begin, seg.end - seg.begin),
                             raw.begin == 0 && seg.begin == 0});
      if (t.pre_tokenizer) t.pre_tokenizer->pre_tokenize(pieces);
      for (const Piece& p : pieces) t.model.tokenize(p.text, ids);
    }
  }
  if (add_special_tokens && t.post_processor) t.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = t.token_of(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && t.special_contents.contains(*token)) continue;
    tokens.push_back(*token);
  }
  std::string text;
  if (t.decoder) {
    t.decoder->decode_chain(tokens);
    for (const std::string& s : tokens) text += s;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) text += (k ? " " : "") + tokens[k];
  }
  return text;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end())
    return it->second;
  return impl_->model.token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->token_of(id);
  MERE_CHECK(token != nullptr, "tokenizer: id {} has no token (vocab size {})", id, vocab_size());
  return *token;
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  // A trailing U+FFFD is a character whose remaining bytes have not arrived yet.
  if (text.size() <= emitted_text_.size() || text.ends_with("\xEF\xBF\xBD")) return {};
  MERE_CHECK(text.starts_with(emitted_text_),
             "stream decode: the text of ids {} no longer starts with the text already emitted",
             ids_);
  std::string fresh = text.substr(emitted_text_.size());
  // The ids just emitted stay as context: decoders look at neighbours (leading space, bytes).
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(emitted_));
  emitted_ = ids_.size();
  emitted_text_ = tokenizer_->decode(ids_, skip_special_tokens_);
  return fresh;
}

std::string StreamDecoder::flush() {
  std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  std::string fresh = text.starts_with(emitted_text_) ? text.substr(emitted_text_.size()) : "";
  ids_.clear();
  emitted_ = 0;
  emitted_text_.clear();
  return fresh;
}

}  // namespace mere
