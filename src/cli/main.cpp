// mere: the command-line entry point.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mere: run large language models from Hugging Face checkpoints, on the CPU or one NVIDIA GPU"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");
  mere::add_tokenize_command(app);
  mere::add_text_commands(app);
  mere::add_eval_commands(app);
  mere::add_bench_command(app);
  mere::add_model_commands(app);
  mere::add_quantize_command(app);
  mere::add_bytes_command(app);
  mere::add_audit_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mere::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mere: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mere: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
