// The `mere` subcommands; main.cpp registers each on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace mere {

void add_tokenize_command(CLI::App& app);  // mere tokenize
void add_text_commands(CLI::App& app);     // mere text generate
void add_template_command(CLI::App& text); // mere text template
void add_chat_command(CLI::App& text);     // mere text chat
void add_model_commands(CLI::App& app);    // mere model add | list | show | remove | runtime
void add_eval_commands(CLI::App& app);     // mere eval logits | ppl
void add_bench_command(CLI::App& app);     // mere bench
void add_quantize_command(CLI::App& app);  // mere quantize
void add_bytes_command(CLI::App& app);     // mere bytes
void add_audit_command(CLI::App& app);     // mere audit

}  // namespace mere
