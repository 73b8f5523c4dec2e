#include "tokenizer/post_processor.h"

#include <string>

#include "tokenizer/json_util.h"

namespace mere {

namespace {

using tokenizer_json::Json;

// The ids around and between: `before` + sequence + `after`.
class WrapProcessor : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}, ...] with the ids of
// each special token in "special_tokens".
std::unique_ptr<PostProcessor> make_template(const Json& j) {
  const std::string where = "post_processor TemplateProcessing";
  const Json& single = tokenizer_json::require(j, "single", where);
  const Json& specials = tokenizer_json::require(j, "special_tokens", where);
  MERE_CHECK(single.is_array(), "{}: 'single' must be an array", where);
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const Json& piece : single) {
    if (piece.contains("Sequence")) {
      std::string id = tokenizer_json::get<std::string>(piece["Sequence"], "id", where);
      MERE_CHECK(id == "A" && !seen_sequence,
                 "{}: 'single' must hold sequence A once, found sequence {}", where, id);
      seen_sequence = true;
    } else if (piece.contains("SpecialToken")) {
      std::string name = tokenizer_json::get<std::string>(piece["SpecialToken"], "id", where);
      auto it = specials.find(name);
      MERE_CHECK(it != specials.end(), "{}: special token '{}' is not in special_tokens", where,
                 name);
      auto ids = tokenizer_json::get<std::vector<int32_t>>(*it, "ids", where);
      auto& dst = seen_sequence ? after : before;
      dst.insert(dst.end(), ids.begin(), ids.end());
    } else {
      fail("{}: unknown template piece {}", where, piece.dump());
    }
  }
  MERE_CHECK(seen_sequence, "{}: 'single' has no sequence A", where);
  return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
}

// "cls": ["<s>", 0], "sep": ["</s>", 2]
int32_t id_of_pair(const Json& j, const char* key, std::string_view where) {
  const Json& pair = tokenizer_json::require(j, key, where);
  MERE_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer(),
             "{}: '{}' must be [token, id], got {}", where, key, pair.dump());
  return pair[1].get<int32_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j) {
  std::string type = tokenizer_json::type_of(j, "post_processor");
  const std::string where = "post_processor " + type;
  if (type == "TemplateProcessing") return make_template(j);
  if (type == "ByteLevel") return std::make_unique<WrapProcessor>(std::vector<int32_t>{},
                                                                  std::vector<int32_t>{});
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{id_of_pair(j, "cls", where)},
                                           std::vector<int32_t>{id_of_pair(j, "sep", where)});
  }
  if (type == "Sequence") {
    tokenizer_json::SequenceLevel level(where);
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const Json& step : tokenizer_json::require(j, "processors", where))
      steps.push_back(make_post_processor(step));
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  fail("post_processor type '{}' is not supported (supported: TemplateProcessing, ByteLevel, "
       "RobertaProcessing, BertProcessing, Sequence)",
       type);
}

}  // namespace mere
