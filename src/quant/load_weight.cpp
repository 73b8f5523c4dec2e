#include "quant/load_weight.h"

namespace mere {

Weight load_weight(const Checkpoint& checkpoint, const std::string& module, const Shape& shape, const std::string& why,
                   const QuantizationConfig& quant) {
  const std::string name = module + ".weight";
  MERE_CHECK(shape.size() == 2 || shape.size() == 3, "load_weight: {} has a rank-{} shape", name, shape.size());
  // A stack of matrices [n, out, in] (MoE experts) is read as one [n * out, in].
  const bool stacked = shape.size() == 3;
  const int64_t n = stacked ? shape[0] : 1, out = shape.end()[-2], in = shape.end()[-1];
  auto with_stack = [&](Shape s) {
    if (stacked) s.insert(s.begin(), n);
    return s;
  };
  auto flat = [&](const Tensor& t) { return stacked ? t.reshape({n * t.dim(1), t.dim(2)}) : t; };
  const std::string file = checkpoint.path().string();
  const bool has_scales = checkpoint.has(module + ".scales"), has_fp8_scales = checkpoint.has(module + ".weight_scale_inv");
  if (quant.fp8_block > 0 && has_fp8_scales) {
    const int b = quant.fp8_block;
    Tensor values = checkpoint.get(name);
    MERE_CHECK(values.dtype() == DType::f8_e4m3 && values.shape() == shape,
               "{}: {} is {} {}, expected fp8 e4m3 (F8_E4M3) {} ({})", file, name, dtype_name(values.dtype()),
               shape_str(values.shape()), shape_str(shape), why);
    MERE_CHECK(!stacked || out % b == 0, "{}: {} stacks matrices of {} rows, not a multiple of the {}-row block",
               file, name, out, b);
    Tensor scale_inv = checkpoint.get(module + ".weight_scale_inv", with_stack({(out + b - 1) / b, (in + b - 1) / b}),
                                      "fp8 block scales of " + name);
    if (scale_inv.dtype() != DType::f32) scale_inv = scale_inv.to(DType::f32);
    return Weight(Fp8Weight{flat(values), flat(scale_inv), b});
  }
  std::optional<AffineSpec> spec = quant.affine_for(module);
  if (spec && has_scales) {
    MERE_CHECK(in % spec->group_size == 0, "{}: {} has {} columns, not a multiple of the group size {}", file, name,
               in, spec->group_size);
    const Shape groups = with_stack({out, in / spec->group_size});
    Tensor packed = checkpoint.get(name);
    MERE_CHECK(packed.dtype() == DType::u32 && packed.shape() == with_stack({out, in * spec->bits / 32}),
               "{}: {} is {} {}, expected u32 {} for {}-bit weights of {} ({})", checkpoint.info(name).file.string(),
               name, dtype_name(packed.dtype()), shape_str(packed.shape()),
               shape_str(with_stack({out, in * spec->bits / 32})), spec->bits, shape_str(shape), why);
    AffineWeight a{flat(packed), flat(checkpoint.get(module + ".scales", groups, "group scales of " + name)),
                   flat(checkpoint.get(module + ".biases", groups, "group biases of " + name)), spec->bits,
                   spec->group_size};
    return Weight(std::move(a), in);
  }
  MERE_CHECK(!has_scales, "{}: {} has group scales but config.json does not quantize {}", file, name, module);
  MERE_CHECK(!has_fp8_scales, "{}: {} has fp8 block scales but config.json's quantization_config is not fp8", file,
             name);
  Tensor dense = checkpoint.get(name, shape, why);
  std::string hint;
  if (spec) hint = " (config.json quantizes it, but it has no .scales)";
  else if (dense.dtype() == DType::f8_e4m3 && quant.fp8_block > 0) hint = " (it needs " + module + ".weight_scale_inv)";
  else if (dense.dtype() == DType::f8_e4m3) hint = " (fp8 needs config.json's quantization_config, quant_method fp8)";
  MERE_CHECK(dense.dtype() == DType::f32 || dense.dtype() == DType::f16 || dense.dtype() == DType::bf16,
             "{}: {} is {}; a dense weight must be f32, f16 or bf16{}", file, name, dtype_name(dense.dtype()), hint);
  return Weight(flat(dense));
}

Tensor load_bias(const Checkpoint& checkpoint, const std::string& name, int64_t n, const std::string& why) {
  Tensor t = checkpoint.get(name, {n}, why);
  return t.dtype() == DType::f32 ? t : t.to(DType::f32);
}

int64_t logical_param_count(const Checkpoint& checkpoint, const QuantizationConfig& quant) {
  // The module of `name` if it ends with `suffix`, else "".
  auto module_of = [](const std::string& name, std::string_view suffix) {
    return name.size() > suffix.size() && name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size())
                                                                  : std::string();
  };
  auto packed = [&](const std::string& module) {
    return checkpoint.has(module + ".weight") && checkpoint.info(module + ".weight").dtype == DType::u32;
  };
  int64_t n = 0;
  for (const std::string& name : checkpoint.names()) {
    const std::string scaled = module_of(name, ".scales"), biased = module_of(name, ".biases");
    if (!module_of(name, ".weight_scale_inv").empty() || (!scaled.empty() && packed(scaled)) ||
        (!biased.empty() && packed(biased)))
      continue;
    const TensorInfo& info = checkpoint.info(name);
    const std::string module = module_of(name, ".weight");
    const std::optional<AffineSpec> spec = module.empty() ? std::nullopt : quant.affine_for(module);
    n += shape_numel(info.shape) * (info.dtype == DType::u32 && spec ? 32 / spec->bits : 1);
  }
  return n;
}

}  // namespace mere
