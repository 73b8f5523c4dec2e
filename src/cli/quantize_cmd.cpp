// mere quantize: a dense checkpoint to an MLX affine-quantized one, or to FP8
// E4M3 with 128x128 block scales (the work is quantize_checkpoint,
// src/quant/quantize_checkpoint.h).
#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "quant/quantize_checkpoint.h"

namespace mere {
namespace {

struct QuantizeFlags {
  std::string model, out, format = "affine";
  int bits = 0, group_size = 64, threads = 0;
  std::vector<std::string> keep;
};

void run_quantize(const QuantizeFlags& f, bool bits_given, bool group_given) {
  apply_threads(f.threads);
  const bool fp8 = f.format == "fp8";
  MERE_CHECK(fp8 || bits_given, "--bits is required for --format affine (4 or 8)");
  MERE_CHECK(!fp8 || (!bits_given && !group_given),
             "--format fp8 writes E4M3 weights with 128x128 block scales; --bits and --group-size are affine options");
  const QuantizeCheckpointOptions options{f.bits, f.group_size, fp8, f.keep};
  const std::filesystem::path out = f.out;
  const QuantizeCheckpointResult r = quantize_checkpoint(resolve_model_dir(f.model), out, options);
  const std::string to = fp8 ? std::string("fp8 e4m3, 128x128 blocks")
                             : fmt::format("int{}, groups of {}", f.bits, f.group_size);
  std::printf("quantized %d of %d tensors to %s (%d matrices left dense): %.1f MB -> %.1f MB "
              "(%.1f%%) in %zu file%s, %d other file%s copied\nwrote %s\n",
              r.n_quantized, r.n_tensors, to.c_str(), r.n_kept, double(r.bytes_in) / 1e6,
              double(r.bytes_out) / 1e6, 100.0 * double(r.bytes_out) / double(std::max<uint64_t>(r.bytes_in, 1)),
              r.n_files, r.n_files == 1 ? "" : "s", r.n_copied, r.n_copied == 1 ? "" : "s", out.c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto f = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Write an MLX affine-quantized (4- or 8-bit) copy of a dense checkpoint, loadable by mere and MLX, or an FP8 "
      "one (E4M3, 128x128 block scales, the Qwen3-FP8 / DeepSeek-V3 layout)");
  cmd->add_option("-m,--model", f->model, "Dense checkpoint directory or registered name")->required();
  cmd->add_option("-o,--out", f->out, "Output directory (new or empty)")->required();
  cmd->add_option("--format", f->format, "affine (MLX, --bits 4 or 8) or fp8 (E4M3, 128x128 block scales)")
      ->check(CLI::IsMember({"affine", "fp8"}))
      ->capture_default_str();
  CLI::Option* bits = cmd->add_option("--bits", f->bits, "Bits per weight of the affine format: 4 or 8");
  CLI::Option* group = cmd->add_option("--group-size", f->group_size,
                                       "Weights sharing one scale and bias (affine): 32, 64 or 128")
                           ->capture_default_str();
  cmd->add_option("--keep", f->keep,
                  "Regular expression searched in module names (e.g. lm_head, 'layers\\.0\\.'): matching "
                  "matrices stay dense; repeatable");
  add_threads_option(*cmd, f->threads);
  cmd->callback([f, bits, group] { run_quantize(*f, bits->count() > 0, group->count() > 0); });
}

}  // namespace mere
