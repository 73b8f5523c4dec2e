// mere tokenize: text -> ids and ids -> text with a tokenizer.json, one text or a JSONL dataset.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

struct TokenizeFlags {
  std::string tokenizer, text, file;
  bool has_text = false;  // --text was given, possibly empty
  bool json = false, special = false, decode = false, jsonl = false, skip_special = false;
};

std::string read_input_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MERE_CHECK(in.good(), "tokenize: cannot read {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ids_to_text(const std::vector<int32_t>& ids, bool json) {
  return json ? nlohmann::json(ids).dump() : fmt::format("{}", fmt::join(ids, " "));
}

std::string text_to_json(const std::string& text) {
  // Decoded text is valid UTF-8 by construction; replace rather than throw just in case.
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One JSON value per line in, one per line out: strings -> id arrays, or with --decode
// id arrays -> strings. Blank lines are skipped.
void run_jsonl(const TokenizeFlags& f, const Tokenizer& tok) {
  std::ifstream file;
  if (!f.file.empty()) {
    file.open(f.file, std::ios::binary);
    MERE_CHECK(file.good(), "tokenize: cannot read {}", f.file);
  }
  std::istream& in = f.file.empty() ? std::cin : file;
  const std::string source = f.file.empty() ? "stdin" : f.file;
  std::string line, out;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("tokenize: {} line {}: not JSON: {}", source, line_no, e.what());
    }
    if (f.decode) {
      MERE_CHECK(value.is_array(), "tokenize: {} line {}: expected an array of ids, got {}", source,
                 line_no, value.type_name());
      std::vector<int32_t> ids;
      for (const auto& v : value) {
        MERE_CHECK(v.is_number_integer(), "tokenize: {} line {}: '{}' is not a token id", source,
                   line_no, v.dump());
        ids.push_back(v.get<int32_t>());
      }
      out = text_to_json(tok.decode(ids, f.skip_special));
    } else {
      MERE_CHECK(value.is_string(), "tokenize: {} line {}: expected a JSON string, got {}", source,
                 line_no, value.type_name());
      out = ids_to_text(tok.encode(value.get_ref<const std::string&>(), f.special), true);
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
}

void run_tokenize(const TokenizeFlags& f) {
  if (f.jsonl) {
    MERE_CHECK(!f.has_text, "tokenize: --jsonl reads --file or stdin, not --text");
    run_jsonl(f, Tokenizer::load(f.tokenizer));
    return;
  }
  // Check the input before spending a second on loading the tokenizer.
  MERE_CHECK(f.has_text || !f.file.empty(), "tokenize: give --text or --file (or --jsonl)");
  std::string input = f.file.empty() ? f.text : read_input_file(f.file);
  std::vector<int32_t> ids;
  if (f.decode) ids = parse_ids(input);
  Tokenizer tok = Tokenizer::load(f.tokenizer);
  std::string out;
  if (f.decode) {
    std::string text = tok.decode(ids, f.skip_special);
    out = f.json ? text_to_json(text) : text;
  } else {
    out = ids_to_text(tok.encode(input, f.special), f.json);
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode text to token ids, or decode ids to text, with a Hugging Face tokenizer");
  cmd->add_option("--tokenizer", flags->tokenizer,
                  "Directory holding tokenizer.json (and tokenizer_config.json), or the file")
      ->required();
  CLI::Option* text = cmd->add_option(
      "--text", flags->text, "The text to encode (with --decode: ids, as \"1,2,3\" or \"1 2 3\")");
  CLI::Option* file = cmd->add_option(
      "--file", flags->file, "Read the text (or with --decode, the ids) from this file");
  text->excludes(file);
  cmd->add_flag("--json", flags->json,
                "Print ids as a JSON array (with --decode: the text as a JSON string)");
  cmd->add_flag("--special", flags->special,
                "Add the special tokens the tokenizer's post-processor adds (BOS/EOS)");
  cmd->add_flag("--decode", flags->decode, "Decode token ids to text instead of encoding");
  cmd->add_flag("--skip-special", flags->skip_special,
                "With --decode: leave special tokens out of the text");
  cmd->add_flag("--jsonl", flags->jsonl,
                "Read one JSON string per line from --file or stdin, write one JSON array of ids "
                "per line (with --decode: arrays in, strings out); the tokenizer loads once");
  cmd->callback([flags, text] {
    flags->has_text = text->count() > 0;
    run_tokenize(*flags);
  });
}

}  // namespace mere
