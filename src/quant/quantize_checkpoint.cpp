#include "quant/quantize_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors_writer.h"
#include "quant/affine_quantize.h"
#include "quant/fp8_quantize.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

constexpr int kFp8Block = 128;

struct KeepPattern {
  std::string text;
  std::regex regex;
};

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }

bool is_weight_file(const fs::path& p) {
  return p.extension() == ".safetensors" || p.filename() == "model.safetensors.index.json";
}

// What happens to one tensor of the input.
struct Plan {
  std::string name;
  bool quantize = false;
};

void check_input(const ConfigJson& config, const Checkpoint& checkpoint) {
  for (const char* key : {"quantization", "quantization_config"})
    MERE_CHECK(!config.has(key),
               "{}: '{}' is set ({}): the checkpoint is already quantized; mere quantize takes a dense "
               "(f32, f16 or bf16) checkpoint",
               config.path().string(), key, config.raw()[key].dump());
  for (const std::string& name : checkpoint.names()) {
    const TensorInfo& t = checkpoint.info(name);
    MERE_CHECK(is_float(t.dtype) && !name.ends_with(".scales") && !name.ends_with(".weight_scale_inv"),
               "{}: tensor {} is {}: the checkpoint is already quantized; mere quantize takes a dense (f32, f16 or "
               "bf16) checkpoint",
               t.file.string(), name, dtype_name(t.dtype));
  }
}

void check_output(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  MERE_CHECK(fs::is_directory(out, ec), "-o {}: exists and is not a directory", out.string());
  MERE_CHECK(fs::directory_iterator(out, ec) == fs::directory_iterator(),
             "-o {}: exists and is not empty; give a new or empty directory", out.string());
}

// MLX writes both keys; Hugging Face's FP8 checkpoints only quantization_config.
void write_config(const fs::path& in, const fs::path& out, const nlohmann::ordered_json& quantization, bool fp8) {
  std::ifstream f(in / "config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(f);  // ConfigJson::load has checked it
  if (!fp8) config["quantization"] = quantization;
  config["quantization_config"] = quantization;
  std::ofstream o(out / "config.json", std::ios::trunc);
  o << config.dump(2) << "\n";
  MERE_CHECK(o.flush(), "{}: cannot write", (out / "config.json").string());
}

QuantizeCheckpointResult write_quantized(const QuantizeCheckpointOptions& f, const fs::path& in, const fs::path& out,
                                         const std::vector<KeepPattern>& keep) {
  ConfigJson config = ConfigJson::load(in / "config.json");
  Checkpoint checkpoint = Checkpoint::open(in);
  check_input(config, checkpoint);

  nlohmann::ordered_json quantization = {{"group_size", f.group_size}, {"bits", f.bits}};
  if (f.fp8)
    quantization = {{"quant_method", "fp8"},
                    {"fmt", "e4m3"},
                    {"activation_scheme", "dynamic"},
                    {"weight_block_size", {kFp8Block, kFp8Block}}};
  std::vector<Plan> plans;
  std::vector<TensorSpec> specs;
  uint64_t bytes_in = 0;
  int n_quantized = 0, n_kept = 0;
  for (const std::string& name : checkpoint.names()) {
    const TensorInfo& t = checkpoint.info(name);
    bytes_in += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    Plan p{name};
    if (name.ends_with(".weight") && t.shape.size() == 2) {
      const std::string module = name.substr(0, name.size() - 7);
      const bool kept = std::any_of(keep.begin(), keep.end(),
                                    [&](const KeepPattern& k) { return std::regex_search(module, k.regex); });
      // FP8 leaves the embeddings dense, as the FP8 releases do.
      const bool embedding = f.fp8 && module.ends_with("embed_tokens");
      p.quantize = !kept && !embedding && (f.fp8 || t.shape[1] % f.group_size == 0);
      if (p.quantize && f.fp8) {
        const int64_t rows = t.shape[0], cols = t.shape[1];
        specs.push_back({name, DType::f8_e4m3, {rows, cols}});
        specs.push_back({name + "_scale_inv", DType::f32,
                         {(rows + kFp8Block - 1) / kFp8Block, (cols + kFp8Block - 1) / kFp8Block}});
        ++n_quantized;
      } else if (p.quantize) {
        const int64_t rows = t.shape[0], cols = t.shape[1];
        specs.push_back({name, DType::u32, {rows, cols * f.bits / 32}});
        specs.push_back({module + ".scales", t.dtype, {rows, cols / f.group_size}});
        specs.push_back({module + ".biases", t.dtype, {rows, cols / f.group_size}});
        ++n_quantized;
      } else {
        if (!f.fp8) quantization[module] = false;  // FP8 modules are known by their weight_scale_inv
        ++n_kept;
        const std::string why = kept ? "--keep"
                                : embedding
                                    ? "an embedding"
                                    : fmt::format("{} columns do not divide into groups of {}", t.shape[1], f.group_size);
        std::fprintf(stderr, "keeping %s dense (%s)\n", module.c_str(), why.c_str());
      }
    }
    if (!p.quantize) specs.push_back({name, t.dtype, t.shape});
    plans.push_back(std::move(p));
  }

  CheckpointWriter writer(out, specs, CheckpointWriter::kDefaultShardBytes, {{"format", f.fp8 ? "pt" : "mlx"}});
  {
    Progress progress(f.fp8 ? std::string("quantize fp8 e4m3 128x128") : fmt::format("quantize int{} g{}", f.bits,
                                                                                   f.group_size),
                      int64_t(plans.size()));
    for (size_t i = 0; i < plans.size(); ++i) {
      const Plan& p = plans[i];
      progress.update(int64_t(i), p.name);
      Tensor t = checkpoint.get(p.name);
      if (p.quantize && f.fp8) {
        Fp8Weight q = quantize_fp8(t, kFp8Block);
        writer.write(p.name, q.values);
        writer.write(p.name + "_scale_inv", q.scale_inv);
      } else if (p.quantize) {
        const std::string module = p.name.substr(0, p.name.size() - 7);
        AffineWeight a = quantize_affine(t, f.bits, f.group_size, t.dtype());
        writer.write(p.name, a.packed);
        writer.write(module + ".scales", a.scales);
        writer.write(module + ".biases", a.biases);
      } else {
        writer.write(p.name, t);
      }
    }
    progress.finish();
  }
  std::vector<fs::path> files = writer.finish();
  write_config(in, out, quantization, f.fp8);

  int n_copied = 0;
  for (const auto& e : fs::directory_iterator(in)) {
    const fs::path& p = e.path();
    if (p.filename() == "config.json" || is_weight_file(p)) continue;
    if (!e.is_regular_file()) {
      std::fprintf(stderr, "not copying %s (not a regular file)\n", p.c_str());
      continue;
    }
    fs::copy_file(p, out / p.filename());
    ++n_copied;
  }

  QuantizeCheckpointResult r;
  for (const TensorSpec& s : specs) r.bytes_out += s.size_bytes();
  r.bytes_in = bytes_in;
  r.n_tensors = int(plans.size());
  r.n_quantized = n_quantized;
  r.n_kept = n_kept;
  r.n_copied = n_copied;
  r.n_files = files.size();
  return r;
}

}  // namespace

QuantizeCheckpointResult quantize_checkpoint(const fs::path& in, const fs::path& out,
                                             const QuantizeCheckpointOptions& options) {
  if (!options.fp8) {
    MERE_CHECK(options.bits == 4 || options.bits == 8, "--bits {}: mere writes 4- or 8-bit affine weights",
               options.bits);
    MERE_CHECK(options.group_size == 32 || options.group_size == 64 || options.group_size == 128,
               "--group-size {}: MLX's affine groups are 32, 64 or 128 weights", options.group_size);
  }
  std::vector<KeepPattern> keep;
  for (const std::string& k : options.keep) {
    try {
      keep.push_back({k, std::regex(k)});
    } catch (const std::regex_error& e) {
      fail("--keep '{}': not a valid regular expression ({})", k, e.what());
    }
  }
  MERE_CHECK(fs::is_directory(in), "-m {}: not a directory; give a checkpoint directory (config.json and "
             "*.safetensors)", in.string());
  MERE_CHECK(fs::exists(in / "config.json"), "-m {}: no config.json; not a Hugging Face checkpoint directory",
             in.string());
  MERE_CHECK(fs::exists(in / "model.safetensors") || fs::exists(in / "model.safetensors.index.json"),
             "-m {}: neither model.safetensors nor model.safetensors.index.json; not a safetensors checkpoint",
             in.string());
  check_output(out);
  std::error_code ec;
  const bool created = !fs::exists(out, ec);
  try {
    return write_quantized(options, in, out, keep);
  } catch (...) {
    // Leave no half-written checkpoint behind: it would look loadable.
    if (created) fs::remove_all(out, ec);
    else
      for (const auto& e : fs::directory_iterator(out, ec)) fs::remove_all(e.path(), ec);
    throw;
  }
}

}  // namespace mere
