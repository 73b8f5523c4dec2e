// mere quantize: a dense checkpoint to an MLX affine-quantized one (the work is
// quantize_checkpoint, src/quant/quantize_checkpoint.h).
#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "quant/quantize_checkpoint.h"

namespace mere {
namespace {

struct QuantizeFlags {
  std::string model, out;
  int bits = 0, group_size = 64, threads = 0;
  std::vector<std::string> keep;
};

void run_quantize(const QuantizeFlags& f) {
  apply_threads(f.threads);
  const QuantizeCheckpointOptions options{f.bits, f.group_size, f.keep};
  const std::filesystem::path out = f.out;
  const QuantizeCheckpointResult r = quantize_checkpoint(resolve_model_dir(f.model), out, options);
  std::printf("quantized %d of %d tensors to int%d, groups of %d (%d matrices left dense): %.1f MB -> %.1f MB "
              "(%.1f%%) in %zu file%s, %d other file%s copied\nwrote %s\n",
              r.n_quantized, r.n_tensors, f.bits, f.group_size, r.n_kept, double(r.bytes_in) / 1e6,
              double(r.bytes_out) / 1e6, 100.0 * double(r.bytes_out) / double(std::max<uint64_t>(r.bytes_in, 1)),
              r.n_files, r.n_files == 1 ? "" : "s", r.n_copied, r.n_copied == 1 ? "" : "s", out.c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto f = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write an MLX affine-quantized (4- or 8-bit) copy of a dense checkpoint, loadable by mere and MLX");
  cmd->add_option("-m,--model", f->model, "Dense checkpoint directory or registered name")->required();
  cmd->add_option("-o,--out", f->out, "Output directory (new or empty)")->required();
  cmd->add_option("--bits", f->bits, "Bits per weight: 4 or 8")->required();
  cmd->add_option("--group-size", f->group_size, "Weights sharing one scale and bias: 32, 64 or 128")
      ->capture_default_str();
  cmd->add_option("--keep", f->keep,
                  "Regular expression searched in module names (e.g. lm_head, 'layers\\.0\\.'): matching "
                  "matrices stay dense; repeatable");
  add_threads_option(*cmd, f->threads);
  cmd->callback([f] { run_quantize(*f); });
}

}  // namespace mere
