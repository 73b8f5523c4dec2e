// Streams generated tokens as text: decodes incrementally (never half a UTF-8
// character) and watches for stop strings, holding back any text that could be
// the start of one.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mere {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  // Text that is now safe to show. After a stop string is seen, is_stopped() is
  // true and the text before the stop string is all that was ever returned.
  std::string push(int32_t id);
  // Whatever was held back, at the end of generation.
  std::string finish();
  bool is_stopped() const { return stopped_; }

 private:
  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace mere
