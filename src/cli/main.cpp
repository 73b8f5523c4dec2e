#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mere: a runtime for large language models"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mere::Error& e) {
    std::fprintf(stderr, "mere: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
