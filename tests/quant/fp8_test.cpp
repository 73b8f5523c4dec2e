// FP8 E4M3 weights with block scales on the CPU: the E4M3 decoding against known
// values, the fused dequantize-dot against dequantize + the dense matmul, a
// Qwen3 checkpoint with fp8 weights (written here from the qwen3 fixture) against
// the same model with the dequantized weights stored dense, and the loader's
// errors on inconsistent metadata; and the FP8 fixture made with torch against
// transformers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "io/checkpoint.h"
#include "io/npy.h"
#include "io/safetensors_writer.h"
#include "models/model.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "ops/weight.h"
#include "quant/fp8_quantize.h"
#include "quant/fp8_test_util.h"
#include "test_util.h"

namespace mere {
namespace {

using test::random_fp8;

// max |got - want| / max |want|.
float relative_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const float max_ref = std::max(1e-30f, test::max_abs(want));
  return test::max_abs_diff(got, want).diff / max_ref;
}

Tensor random_f32(Shape shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  ops::fill_random(t, seed, scale);
  return t;
}

// The encoder quant/fp8_quantize uses: every finite code comes back as itself,
// a value halfway between two codes goes to the even one, beyond 448 saturates,
// NaN stays NaN.
TEST(Fp8, E4m3EncodesToTheNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f || c == 0x80) continue;  // NaN; -0 encodes as +0's sign-flipped twin below
    EXPECT_EQ(f32_to_f8_e4m3(f8_e4m3_to_f32(uint8_t(c))), c) << c;
  }
  EXPECT_EQ(f32_to_f8_e4m3(-0.0f), 0x80);
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = f8_e4m3_to_f32(uint8_t(c)), hi = f8_e4m3_to_f32(uint8_t(c + 1));
    EXPECT_EQ(f32_to_f8_e4m3((lo + hi) / 2), c % 2 ? c + 1 : c) << "halfway above code " << c;
    EXPECT_EQ(f32_to_f8_e4m3(lo + (hi - lo) * 0.25f), c) << c;
    EXPECT_EQ(f32_to_f8_e4m3(lo + (hi - lo) * 0.75f), c + 1) << c;
  }
  EXPECT_EQ(f32_to_f8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_f8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_f8_e4m3(1e-9f), 0x00);
}

// quantize_fp8: per 128x128 block (partial at the edges) scale = amax / 448, so
// each block's largest weight lands on +-448 exactly, and every value is the
// nearest E4M3 code of w / scale; an all-zero block keeps scale 1; non-finite
// weights are refused by position.
TEST(Fp8, QuantizeScalesEachBlockToItsLargestWeight) {
  Tensor w = random_f32({300, 200}, 21, 0.05f);
  for (int64_t i = 128 * 200; i < 256 * 200; ++i) w.data<float>()[i] = 0;  // block row 1 all zero
  const Fp8Weight q = quantize_fp8(w, 128);
  ASSERT_EQ(q.values.shape(), (Shape{300, 200}));
  ASSERT_EQ(q.scale_inv.shape(), (Shape{3, 2}));
  for (int64_t br = 0; br < 3; ++br)
    for (int64_t bc = 0; bc < 2; ++bc) {
      float amax = 0;
      for (int64_t r = br * 128; r < std::min<int64_t>(300, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min<int64_t>(200, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(w.data<float>()[r * 200 + c]));
      const float scale = q.scale_inv.data<float>()[br * 2 + bc];
      EXPECT_EQ(scale, amax > 0 ? amax / 448.0f : 1.0f) << br << "," << bc;
      for (int64_t r = br * 128; r < std::min<int64_t>(300, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min<int64_t>(200, bc * 128 + 128); ++c)
          ASSERT_EQ(q.values.data<uint8_t>()[r * 200 + c], f32_to_f8_e4m3(w.data<float>()[r * 200 + c] / scale))
              << r << "," << c;
    }
  const Tensor back = Weight(q).dequantize(DType::f32);
  EXPECT_LE(relative_error(back, w), 1.0f / 16);  // 3 mantissa bits: within half a step of the block's largest
  Tensor bad = random_f32({4, 256}, 22);
  bad.data<float>()[300] = std::nanf("");
  EXPECT_THROW(quantize_fp8(bad, 128), Error);
}

TEST(Fp8, E4m3DecodesKnownValues) {
  EXPECT_EQ(f8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x38), 1.0f);      // exponent 7 (the bias), mantissa 0
  EXPECT_EQ(f8_e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(f8_e4m3_to_f32(0x7e), 448.0f);    // the largest finite value
  EXPECT_EQ(f8_e4m3_to_f32(0x08), 0x1p-6f);   // the smallest normal
  EXPECT_EQ(f8_e4m3_to_f32(0x01), 0x1p-9f);   // the smallest subnormal
  EXPECT_EQ(f8_e4m3_to_f32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(f8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::signbit(f8_e4m3_to_f32(0x80)) && f8_e4m3_to_f32(0x80) == 0.0f);
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0xff)));
  for (int b = 0; b < 0x7e; ++b) EXPECT_LT(f8_e4m3_to_f32(uint8_t(b)), f8_e4m3_to_f32(uint8_t(b + 1))) << b;
}

// The reference pinned by hand: blocks of 2, a [3, 3] weight, so the last block
// row and column are partial.
TEST(Fp8, LinearMatchesHandComputedValues) {
  Tensor values = Tensor::empty({3, 3}, DType::f8_e4m3);
  const uint8_t bytes[9] = {0x38, 0x40, 0xb8,   // 1, 2, -1
                            0x30, 0x00, 0x44,   // 0.5, 0, 3
                            0x3c, 0x48, 0x01};  // 1.5, 4, 2^-9
  std::copy(bytes, bytes + 9, values.data<uint8_t>());
  Tensor scales = Tensor::from_floats({0.5f, 2.0f, 0.25f, 4.0f}, {2, 2});
  Weight w(Fp8Weight{values, scales, 2});
  Tensor x = Tensor::from_floats({1.0f, 2.0f, 3.0f}, {1, 3});
  Tensor b = Tensor::from_floats({0.0f, 1.0f, -1.0f}, {3});
  // Row 0: (1*1 + 2*2) * 0.5 + (-1*3) * 2 = -3.5; row 1: (0.5*1) * 0.5 + (3*3) * 2 = 18.25 (+1);
  // row 2: (1.5*1 + 4*2) * 0.25 + (2^-9 * 3) * 4 = 2.375 + 3 * 2^-7 (-1).
  const std::vector<float> want = {-3.5f, 19.25f, 1.375f + 3 * 0x1p-7f};
  Tensor got = ops::linear(x, w, b);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(got.at(i), want[size_t(i)]) << i;
  Tensor dense = w.dequantize(DType::f32);
  EXPECT_FLOAT_EQ(dense.at(8), 0x1p-9f * 4.0f);
  EXPECT_FLOAT_EQ(dense.at(5), 3.0f * 2.0f);
}

TEST(Fp8, FusedLinearMatchesDequantizedDense) {
  struct Case { int64_t out, in; int block; };
  for (Case c : {Case{1, 16, 128}, Case{7, 200, 128}, Case{130, 300, 128}, Case{256, 384, 128}, Case{33, 129, 128},
                 Case{40, 100, 64}})
    for (int64_t T : {1, 2, 5, 17})
      for (bool with_bias : {false, true}) {
        Weight w(random_fp8(c.out, c.in, c.block, uint64_t(c.out * 1000 + c.in)));
        Tensor x = random_f32({T, c.in}, uint64_t(T)), b = with_bias ? random_f32({c.out}, 7) : Tensor();
        Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
        EXPECT_LE(relative_error(ops::linear(x, w, b), want), 1e-5f)
            << "T=" << T << " " << c.out << "x" << c.in << " block " << c.block << (with_bias ? " bias" : "");
      }
}

// The CPU's product with lever cpu_tiled_matmul (the block scales folded into
// the decoded rows, the register-tiled product) and without (a dot product per
// column block, scaled after): both against the dequantized matmul.
TEST(Fp8, CpuTiledProductMatchesDequantizedDense) {
  struct Case { int64_t out, in; int block; };
  for (bool tiled : {true, false})
    for (Case c : {Case{7, 200, 128}, Case{130, 300, 128}, Case{33, 129, 128}, Case{40, 100, 64}})
      for (int64_t T : {1, 2, 5, 17}) {
        Weight w(random_fp8(c.out, c.in, c.block, uint64_t(c.out * 1000 + c.in)));
        Tensor x = random_f32({T, c.in}, uint64_t(T)), b = random_f32({c.out}, 7);
        Tensor want = ops::linear(x, w.dequantize(DType::f32), b);
        bool applies = false, ran_tiled = false;
        Tensor got;
        {
          const test::CpuLever lever(ops::cpu::set_tiled_matmul, tiled);
          applies = ops::cpu::tiled_matmul_applies();  // false without AVX2
          const int64_t blocks = ops::cpu::tiled_matmul_blocks();
          got = ops::linear(x, w, b);
          ran_tiled = ops::cpu::tiled_matmul_blocks() > blocks;
        }
        EXPECT_LE(relative_error(got, want), 1e-5f)
            << (tiled ? "tiled " : "dots ") << "T=" << T << " " << c.out << "x" << c.in << " block " << c.block;
        EXPECT_EQ(ran_tiled, applies);
      }
}

// Every finite E4M3 code, decoded 16 at a time by the CPU's product (and the
// table for a tail), is its exact value times its block's scale: a [1, 270] row
// of codes 0..254 but the NaN code 0x7f (0 there), and 15 more, against one-hot
// tokens; a NaN code gives NaN.
TEST(Fp8, CpuProductDecodesEveryCodeExactly) {
  const int64_t in = 270;
  Tensor values = Tensor::empty({1, in}, DType::f8_e4m3);
  for (int64_t c = 0; c < in; ++c) values.data<uint8_t>()[c] = uint8_t(c % 255 == 0x7f ? 0 : c % 255);
  const std::vector<float> block_scales = {0.5f, 2.0f, 0.25f};
  Weight w(Fp8Weight{values, Tensor::from_floats(block_scales, {1, 3}), 128});
  std::vector<float> one_hot(size_t(in * in), 0.0f);
  for (int64_t t = 0; t < in; ++t) one_hot[size_t(t * in + t)] = 1.0f;
  const Tensor x = Tensor::from_floats(one_hot, {in, in});
  for (bool tiled : {true, false}) {
    const test::CpuLever lever(ops::cpu::set_tiled_matmul, tiled);
    const Tensor got = ops::linear(x, w, Tensor());
    for (int64_t t = 0; t < in; ++t)
      EXPECT_EQ(got.at(t), f8_e4m3_to_f32(values.data<uint8_t>()[t]) * block_scales[size_t(t / 128)])
          << (tiled ? "tiled" : "dots") << " code " << int(values.data<uint8_t>()[t]);
    for (uint8_t nan_code : {uint8_t(0x7f), uint8_t(0xff)}) {
      Tensor bad = values.clone();
      bad.data<uint8_t>()[5] = nan_code;
      const Tensor y = ops::linear(Tensor::from_floats(std::vector<float>(size_t(in), 1.0f), {1, in}),
                                   Weight(Fp8Weight{bad, Tensor::from_floats(block_scales, {1, 3}), 128}), Tensor());
      EXPECT_TRUE(std::isnan(y.at(0))) << (tiled ? "tiled" : "dots") << " code " << int(nan_code);
    }
  }
}

TEST(Fp8, EmbedMatchesDequantizedRows) {
  Weight w(random_fp8(300, 200, 128, 3));
  Tensor dense = w.dequantize(DType::f32);
  std::vector<int32_t> ids = {0, 299, 128, 127, 5};
  Tensor ids_t = Tensor::empty({5}, DType::i32);
  std::copy(ids.begin(), ids.end(), ids_t.data<int32_t>());
  Tensor got = ops::embed(w, ids_t);
  EXPECT_EQ(test::max_abs_diff(got, ops::embed(dense, ids)).diff, 0.0f);
}

TEST(Fp8, ConcatRowsStacksWholeBlocks) {
  Weight a(random_fp8(128, 200, 128, 1)), b(random_fp8(256, 200, 128, 2)), c(random_fp8(70, 200, 128, 3));
  Weight fused = Weight::concat_rows({a, b, c});
  ASSERT_TRUE(fused.defined());
  EXPECT_EQ(fused.rows(), 454);
  Tensor x = random_f32({3, 200}, 4);
  std::vector<Tensor> parts = ops::split_columns(ops::linear(x, fused), {128, 256, 70});
  EXPECT_LE(relative_error(parts[0], ops::linear(x, a)), 1e-6f);
  EXPECT_LE(relative_error(parts[1], ops::linear(x, b)), 1e-6f);
  EXPECT_LE(relative_error(parts[2], ops::linear(x, c)), 1e-6f);
  // A part of 70 rows before another would put one block across the seam.
  EXPECT_FALSE(Weight::concat_rows({c, a}).defined());
}

// ---- checkpoints --------------------------------------------------------------

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> v = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = f8_e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return v;
}

// The E4M3 byte nearest to v (|v| <= 448).
uint8_t nearest_e4m3(float v) {
  uint8_t best = 0;
  float best_diff = std::numeric_limits<float>::infinity();
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float d = std::fabs(e4m3_values()[size_t(b)] - v);
    if (d < best_diff) best_diff = d, best = uint8_t(b);
  }
  return best;
}

// A dense [out, in] f32 weight quantized as the FP8 checkpoints do it: one scale
// per 128x128 block, amax / 448, stored as `scale_dtype` (f32 or bf16).
Fp8Weight quantize_fp8(const Tensor& w, DType scale_dtype) {
  const int64_t out = w.dim(0), in = w.dim(1), rb = (out + 127) / 128, cb = (in + 127) / 128;
  Tensor scales = Tensor::empty({rb, cb}, DType::f32), values = Tensor::empty({out, in}, DType::f8_e4m3);
  for (int64_t br = 0; br < rb; ++br)
    for (int64_t bc = 0; bc < cb; ++bc) {
      float amax = 0;
      for (int64_t o = br * 128; o < std::min(out, br * 128 + 128); ++o)
        for (int64_t i = bc * 128; i < std::min(in, bc * 128 + 128); ++i)
          amax = std::max(amax, std::fabs(w.at(o * in + i)));
      float s = amax > 0 ? amax / 448.0f : 1.0f;
      if (scale_dtype == DType::bf16) s = bf16_to_f32(f32_to_bf16(s));  // what the file will hold
      scales.data<float>()[br * cb + bc] = s;
      for (int64_t o = br * 128; o < std::min(out, br * 128 + 128); ++o)
        for (int64_t i = bc * 128; i < std::min(in, bc * 128 + 128); ++i)
          values.data<uint8_t>()[o * in + i] = nearest_e4m3(std::clamp(w.at(o * in + i) / s, -448.0f, 448.0f));
    }
  return {values, scales, 128};
}

bool is_linear(const std::string& name) {
  return name.ends_with("proj.weight") || name == "lm_head.weight";
}

// Writes the qwen3 fixture twice: `fp8_dir` with every linear weight (and, if
// `embed_too`, the embedding) in FP8 with block scales, and `dense_dir` with the
// same weights dequantized to f32, the reference. `edit` changes the config.
void write_fp8_qwen3(const std::filesystem::path& fp8_dir, const std::filesystem::path& dense_dir, bool tied,
                     const std::function<void(nlohmann::json&)>& edit = {}) {
  const auto src = test::fixtures_dir() / "qwen3";
  Checkpoint ck = Checkpoint::open(src);
  nlohmann::json config = test::read_json(src / "config.json");
  config["tie_word_embeddings"] = tied;
  std::vector<NamedTensor> fp8_tensors, dense_tensors;
  int n = 0;
  for (const std::string& name : ck.names()) {
    if (tied && name == "lm_head.weight") continue;
    Tensor t = ck.get(name);
    if (t.dtype() != DType::f32) t = t.to(DType::f32);
    const bool quantize = is_linear(name) || (tied && name == "model.embed_tokens.weight");
    if (!quantize) {
      fp8_tensors.push_back({name, t});
      dense_tensors.push_back({name, t});
      continue;
    }
    // Alternate the scale dtype: checkpoints store them as f32 (DeepSeek-V3) or bf16.
    const DType scale_dtype = n++ % 2 ? DType::bf16 : DType::f32;
    Fp8Weight f = quantize_fp8(t, scale_dtype);
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    fp8_tensors.push_back({name, f.values});
    fp8_tensors.push_back({module + ".weight_scale_inv", f.scale_inv.to(scale_dtype)});
    dense_tensors.push_back({name, Weight(f).dequantize(DType::f32)});
  }
  std::filesystem::create_directories(fp8_dir);
  std::filesystem::create_directories(dense_dir);
  test::write_file(dense_dir / "config.json", config.dump(2));
  write_safetensors(dense_dir / "model.safetensors", dense_tensors);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {128, 128}}};
  if (edit) edit(config);
  test::write_file(fp8_dir / "config.json", config.dump(2));
  write_safetensors(fp8_dir / "model.safetensors", fp8_tensors);
}

std::vector<int32_t> fixture_ids() {
  return test::read_json(test::fixtures_dir() / "qwen3" / "reference.json")["ids"].get<std::vector<int32_t>>();
}

TEST(Fp8, CheckpointLoadsAndMatchesTheDequantizedModel) {
  for (bool tied : {false, true}) {
    const auto dir = test::temp_dir(tied ? "tied" : "untied");
    write_fp8_qwen3(dir / "fp8", dir / "dense", tied);
    auto model = load_model(dir / "fp8");
    auto reference = load_model(dir / "dense");
    const std::vector<int32_t> ids = fixture_ids();
    auto state = model->make_state(), ref_state = reference->make_state();
    Tensor got = model->forward(ids, *state, /*all_logits=*/true);
    Tensor want = reference->forward(ids, *ref_state, /*all_logits=*/true);
    const float rel = relative_error(got, want);
    std::printf("[ fp8      ] qwen3 %s: logits vs the dequantized model %.2e\n", tied ? "tied" : "untied", rel);
    // How far 8-bit weights move the logits of the original f32 model (not asserted).
    if (!tied)
      std::printf("[ fp8      ] qwen3: logits vs the f32 fixture %.2e\n",
                  relative_error(got, read_npy(test::fixtures_dir() / "qwen3" / "logits.npy")));
    EXPECT_LE(rel, 1e-5f);
    // Decode one token at a time after half the prompt: the T = 1 path.
    auto inc = model->make_state();
    const size_t half = ids.size() / 2;
    model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + long(half)), *inc, false);
    Tensor last;
    for (size_t t = half; t < ids.size(); ++t) last = model->forward({ids[t]}, *inc, false);
    EXPECT_LE(relative_error(last, want.slice_rows(want.dim(0) - 1, want.dim(0))), 1e-5f);
  }
}

// The checkpoint torch wrote (float8_e4m3fn values, f32 and bf16 scales;
// scripts/make_fp8_fixture.py) against transformers' logits of its dequantized weights.
TEST(Fp8, FixtureMatchesTransformers) {
  const auto dir = test::fixtures_dir() / "qwen3-fp8";
  const std::vector<int32_t> ids = test::read_json(dir / "reference.json")["ids"].get<std::vector<int32_t>>();
  Tensor want = read_npy(dir / "logits.npy");
  auto model = load_model(dir);
  auto state = model->make_state();
  Tensor got = model->forward(ids, *state, /*all_logits=*/true);
  const float rel = relative_error(got, want);
  std::printf("[ fp8      ] qwen3-fp8 fixture: logits vs transformers %.2e\n", rel);
  EXPECT_LE(rel, 1e-4f);
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_contains(const std::string& message, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "message: " << message << "\nlacks: " << p;
}

TEST(Fp8, InconsistentMetadataIsAClearError) {
  const auto dir = test::temp_dir("errors");
  write_fp8_qwen3(dir / "fp8", dir / "dense", false);
  // Scales of the wrong shape: name the tensor and both shapes.
  {
    const auto bad = dir / "bad_scales";
    std::filesystem::create_directories(bad);
    std::filesystem::copy(dir / "fp8" / "config.json", bad / "config.json");
    Checkpoint ck = Checkpoint::open(dir / "fp8");
    std::vector<NamedTensor> tensors;
    for (const std::string& name : ck.names())
      tensors.push_back({name, name == "model.layers.1.mlp.down_proj.weight_scale_inv"
                                   ? Tensor::zeros({1, 2}, DType::f32)
                                   : ck.get(name)});
    write_safetensors(bad / "model.safetensors", tensors);
    expect_contains(load_error(bad), {"model.layers.1.mlp.down_proj.weight_scale_inv", "[1, 2]", "[1, 1]"});
  }
  // FP8 weights, but config.json says nothing of quantization.
  {
    const auto bad = dir / "no_config";
    std::filesystem::create_directories(bad);
    std::filesystem::copy(dir / "fp8" / "model.safetensors", bad / "model.safetensors");
    nlohmann::json config = test::read_json(dir / "fp8" / "config.json");
    config.erase("quantization_config");
    test::write_file(bad / "config.json", config.dump(2));
    expect_contains(load_error(bad), {"lm_head.weight", "fp8", "quantization_config"});
  }
  // A quantization method we do not run.
  {
    const auto bad = dir / "gptq";
    std::filesystem::create_directories(bad);
    std::filesystem::copy(dir / "fp8" / "model.safetensors", bad / "model.safetensors");
    nlohmann::json config = test::read_json(dir / "fp8" / "config.json");
    config["quantization_config"]["quant_method"] = "gptq";
    test::write_file(bad / "config.json", config.dump(2));
    expect_contains(load_error(bad), {"config.json", "quant_method", "gptq"});
  }
  // An fp8 weight whose scales are missing.
  {
    const auto bad = dir / "no_scales";
    std::filesystem::create_directories(bad);
    std::filesystem::copy(dir / "fp8" / "config.json", bad / "config.json");
    Checkpoint ck = Checkpoint::open(dir / "fp8");
    std::vector<NamedTensor> tensors;
    for (const std::string& name : ck.names())
      if (name != "model.layers.2.self_attn.o_proj.weight_scale_inv") tensors.push_back({name, ck.get(name)});
    write_safetensors(bad / "model.safetensors", tensors);
    expect_contains(load_error(bad), {"model.layers.2.self_attn.o_proj.weight", "f8_e4m3", "weight_scale_inv"});
  }
}

}  // namespace
}  // namespace mere
