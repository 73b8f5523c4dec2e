// Pieces several subcommands share: finding the model, parsing id lists.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "core/device.h"

namespace mere {

// The model directory given with -m, or the embedded default model.
std::filesystem::path resolve_model_dir(const std::string& flag);
std::filesystem::path default_model_dir();

// "1,2,3" or "1 2 3" -> ids; anything else is an error naming the bad item.
std::vector<int32_t> parse_ids(const std::string& text);

// Adds --device cpu|cuda|auto; resolve_device() picks cuda when a GPU is present.
void add_device_option(CLI::App& cmd, std::string& device);
Device resolve_device(const std::string& flag);

// "512,4096" -> {512, 4096}; each item a non-negative integer.
std::vector<int64_t> parse_int_list(const std::string& text, const char* flag);

// Adds --threads to a subcommand; apply_threads() sets the pool size from it.
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

}  // namespace mere
