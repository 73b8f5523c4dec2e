// The decode byte model (mere bytes): totals counted by hand for the fixtures and for
// the published configs of Llama-3-8B, Qwen3-30B-A3B and DeepSeek-V3, and the same
// totals as the loaded model's own count (Model::decode_bytes) on the CPU.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "audit/byte_model.h"
#include "models/model.h"
#include "test_util.h"

namespace mere {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ConfigJson config_of(json j) { return ConfigJson::from_json(std::move(j), "config.json"); }
ConfigJson fixture_config(const std::string& name) {
  return ConfigJson::load(test::fixtures_dir() / name / "config.json");
}

ByteModel count(const ConfigJson& c, int64_t context = 0, KvCacheMode mode = KvCacheMode::native,
                Device device = Device::cuda, std::string weights = "", int group_size = 64) {
  return byte_model(c, {context, mode, device, std::move(weights), group_size});
}

// meta-llama/Meta-Llama-3-8B config.json (the fields the model reads).
json llama3_8b() {
  return {{"model_type", "llama"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
          {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
          {"vocab_size", 128256}, {"max_position_embeddings", 8192}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0}, {"tie_word_embeddings", false}, {"attention_bias", false},
          {"mlp_bias", false}, {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}};
}

// Qwen/Qwen3-30B-A3B config.json.
json qwen3_30b_a3b() {
  return {{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"intermediate_size", 6144},
          {"moe_intermediate_size", 768}, {"num_hidden_layers", 48}, {"num_attention_heads", 32},
          {"num_key_value_heads", 4}, {"head_dim", 128}, {"num_experts", 128}, {"num_experts_per_tok", 8},
          {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()}, {"norm_topk_prob", true},
          {"vocab_size", 151936}, {"tie_word_embeddings", false}, {"attention_bias", false},
          {"max_position_embeddings", 40960}, {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}};
}

// deepseek-ai/DeepSeek-V3 config.json, as bf16 (the published one is fp8: see below).
json deepseek_v3() {
  return {{"model_type", "deepseek_v3"}, {"hidden_size", 7168}, {"intermediate_size", 18432},
          {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61}, {"num_attention_heads", 128},
          {"num_key_value_heads", 128}, {"q_lora_rank", 1536}, {"kv_lora_rank", 512},
          {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
          {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
          {"first_k_dense_replace", 3}, {"moe_layer_freq", 1}, {"topk_method", "noaux_tc"},
          {"num_nextn_predict_layers", 1}, {"vocab_size", 129280}, {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"}};
}

TEST(ByteModel, Llama3_8bByHand) {
  const ByteModel m = count(config_of(llama3_8b()), /*context=*/8192);
  EXPECT_EQ(m.bucket("embedding_row"), 4096u * 2);
  // q, k, v, o: [4096, 4096], [1024, 4096] x 2, [4096, 4096], bf16, 32 layers.
  EXPECT_EQ(m.bucket("attention"), 32ull * (4096 * 4096 + 2 * 1024 * 4096 + 4096 * 4096) * 2);
  EXPECT_EQ(m.bucket("dense_mlp"), 32ull * 3 * 4096 * 14336 * 2);
  EXPECT_EQ(m.bucket("routed_experts"), 0u);
  EXPECT_EQ(m.bucket("routers"), 0u);
  EXPECT_EQ(m.bucket("norms"), (32ull * 2 * 4096 + 4096) * 2);
  EXPECT_EQ(m.bucket("lm_head"), 128256ull * 4096 * 2);
  // K and V, 8 heads x 128, bf16 (the CUDA cache), 32 layers, 8192 positions.
  EXPECT_EQ(m.bucket("cache"), 8192ull * 32 * 2 * 8 * 128 * 2);
  EXPECT_EQ(m.total_bytes(), 15009857536ull + 1073741824ull);
  // 4.287e12 / 16.08e9 B = 266.6 tok/s; at context 0, 285.6 (docs/benchmarks.md's roofline for this shape).
  EXPECT_NEAR(count(config_of(llama3_8b())).roofline_tok_s(kH200CopyBytesPerS), 4.287e12 / 15009857536.0, 1e-9);
}

TEST(ByteModel, Llama3_8bQuantizedWeightsAndCacheModes) {
  const ConfigJson c = config_of(llama3_8b());
  // int4 g64: half a byte per weight + a bf16 scale and bias per 64 weights.
  const ByteModel q4 = count(c, 0, KvCacheMode::native, Device::cuda, "int4", 64);
  EXPECT_EQ(q4.bucket("lm_head"), 128256ull * 4096 / 2 + 2ull * 128256 * (4096 / 64) * 2);
  EXPECT_EQ(q4.bucket("embedding_row"), 4096u / 2 + 2u * (4096 / 64) * 2);
  EXPECT_EQ(q4.bucket("norms"), (32ull * 2 * 4096 + 4096) * 2);  // norms stay dense
  EXPECT_EQ(q4.weights, "affine int4 g64");
  // fp8: one byte per weight + an f32 scale per 128x128 block; embedding and lm_head stay bf16.
  const ByteModel f8 = count(c, 0, KvCacheMode::native, Device::cuda, "fp8");
  EXPECT_EQ(f8.bucket("dense_mlp"), 32ull * 3 * (4096ull * 14336 + (4096 / 128) * (14336 / 128) * 4));
  EXPECT_EQ(f8.bucket("lm_head"), 128256ull * 4096 * 2);
  // The cache modes' row bytes: affine8 one byte + 4 bytes per 64, affine4 half a byte + 4 per 64.
  EXPECT_EQ(count(c, 1000, KvCacheMode::affine8).bucket("cache"), 1000ull * 32 * 2 * (8 * 128 + 8 * 2 * 4));
  EXPECT_EQ(count(c, 1000, KvCacheMode::affine4).bucket("cache"), 1000ull * 32 * 2 * (8 * 128 / 2 + 8 * 2 * 4));
  EXPECT_EQ(count(c, 1000, KvCacheMode::native, Device::cpu).bucket("cache"), 1000ull * 32 * 2 * 8 * 128 * 4);
}

TEST(ByteModel, Qwen3_30bA3bByHand) {
  const ByteModel m = count(config_of(qwen3_30b_a3b()));
  EXPECT_EQ(m.n_sparse_layers, 48);
  EXPECT_EQ(m.bucket("embedding_row"), 2048u * 2);
  // q [32 * 128, 2048], k and v [4 * 128, 2048], o [2048, 4096].
  EXPECT_EQ(m.bucket("attention"), 48ull * (4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096) * 2);
  EXPECT_EQ(m.bucket("dense_mlp"), 0u);
  // 8 of 128 experts, each gate/up [768, 2048] and down [2048, 768].
  EXPECT_EQ(m.bucket("routed_experts"), 48ull * 8 * 3 * 768 * 2048 * 2);
  EXPECT_EQ(m.bucket("shared_experts"), 0u);
  EXPECT_EQ(m.bucket("routers"), 48ull * 128 * 2048 * 2);
  // Two norms of 2048 and q/k norms of 128 per layer, the final norm.
  EXPECT_EQ(m.bucket("norms"), (48ull * (2 * 2048 + 2 * 128) + 2048) * 2);
  EXPECT_EQ(m.bucket("lm_head"), 151936ull * 2048 * 2);
  EXPECT_EQ(m.total_bytes(), 6083739648ull);

  // decoder_sparse_step 2 and mlp_only_layers: the other layers are dense MLPs.
  json j = qwen3_30b_a3b();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {1};
  const ByteModel s = count(config_of(j));
  EXPECT_EQ(s.n_sparse_layers, 23);  // layers 1, 3, ..., 47 minus layer 1
  EXPECT_EQ(s.bucket("dense_mlp"), 25ull * 3 * 2048 * 6144 * 2);
  EXPECT_EQ(s.bucket("routed_experts"), 23ull * 8 * 3 * 768 * 2048 * 2);
}

TEST(ByteModel, DeepSeekV3ByHand) {
  const ByteModel m = count(config_of(deepseek_v3()), /*context=*/4096);
  EXPECT_EQ(m.n_sparse_layers, 58);
  EXPECT_EQ(m.cache, "latent");
  // q_a [1536, 7168], q_b [128 * 192, 1536], kv_a [512 + 64, 7168], kv_b [128 * 256, 512], o [7168, 128 * 128].
  EXPECT_EQ(m.bucket("attention"),
            61ull * (1536 * 7168 + 128 * 192 * 1536 + 576 * 7168 + 128 * 256 * 512 + 7168 * 128 * 128) * 2);
  EXPECT_EQ(m.bucket("dense_mlp"), 3ull * 3 * 7168 * 18432 * 2);  // layers 0-2
  EXPECT_EQ(m.bucket("routed_experts"), 58ull * 8 * 3 * 7168 * 2048 * 2);
  EXPECT_EQ(m.bucket("shared_experts"), 58ull * 3 * 7168 * 2048 * 2);
  // Router [256, 7168] bf16 + its f32 score-correction bias.
  EXPECT_EQ(m.bucket("routers"), 58ull * (256 * 7168 * 2 + 256 * 4));
  EXPECT_EQ(m.bucket("norms"), (61ull * (1536 + 512 + 2 * 7168) + 7168) * 2);
  EXPECT_EQ(m.bucket("lm_head"), 129280ull * 7168 * 2);
  // The latent: 512 + 64 values per position per layer, bf16.
  EXPECT_EQ(m.bucket("cache"), 4096ull * 61 * 576 * 2);
  // About 36.6e9 weights read per token: DeepSeek-V3's published "37B activated"
  // (which also counts the embedding table).
  EXPECT_EQ(m.total_bytes() - m.bucket("cache"), 73251280896ull);

  // The published checkpoint: fp8 blocks of 128 on the block matrices; embedding, lm_head and routers bf16.
  json f = deepseek_v3();
  f["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}},
                              {"activation_scheme", "dynamic"}};
  const ByteModel q = count(config_of(f));
  EXPECT_EQ(q.weights, "fp8 e4m3 128x128");
  EXPECT_EQ(q.bucket("shared_experts"), 58ull * (2 * (2048 * 7168 + 16 * 56 * 4) + (7168 * 2048 + 56 * 16 * 4)));
  EXPECT_EQ(q.bucket("lm_head"), m.bucket("lm_head"));
  EXPECT_EQ(q.bucket("routers"), m.bucket("routers"));
}

TEST(ByteModel, FixturesByHand) {
  // llama: d 64, d_ff 160, 2 layers, 4 heads / 2 kv heads of 16, vocab 512, bf16, untied.
  const ByteModel llama = count(fixture_config("llama"), /*context=*/10, KvCacheMode::native, Device::cpu);
  EXPECT_EQ(llama.total_bytes(), 64u * 2                                           // embedding row
                                     + 2u * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64) * 2  // attention
                                     + 2u * 3 * 160 * 64 * 2                      // MLP
                                     + (2u * 2 * 64 + 64) * 2                     // norms
                                     + 512u * 64 * 2                              // lm_head
                                     + 10u * 2 * 2 * (2 * 16) * 4);               // f32 K and V (CPU)
  // qwen2: d 64, d_ff 128, 2 layers, 4 heads / 1 kv head of 16, f16, tied, q/k/v biases (f32 in mere).
  const ByteModel qwen2 = count(fixture_config("qwen2"));
  EXPECT_EQ(qwen2.bucket("attention"), 2u * ((64 * 64 + 16 * 64 + 16 * 64 + 64 * 64) * 2 + (64 + 16 + 16) * 4));
  EXPECT_EQ(qwen2.total_bytes(), 128u + 41728 + 2u * 3 * 128 * 64 * 2 + 640 + 512u * 64 * 2);
  // qwen3-mlx4: d 64, d_ff 96, 3 layers, 4 heads / 2 kv heads of 32, f32, int4 g32 (f32 scales and biases).
  // A quantized [out, in]: out * in / 2 + 2 * out * (in / 32) * 4.
  auto q4 = [](uint64_t out, uint64_t in) { return out * in / 2 + 2 * out * (in / 32) * 4; };
  const ByteModel mlx4 = count(fixture_config("qwen3-mlx4"));
  EXPECT_EQ(mlx4.bucket("attention"), 3 * (q4(128, 64) + 2 * q4(64, 64) + q4(64, 128)));
  EXPECT_EQ(mlx4.total_bytes(), q4(1, 64) + 3 * (q4(128, 64) + 2 * q4(64, 64) + q4(64, 128)) +
                                    3 * (2 * q4(96, 64) + q4(64, 96)) + (3u * (2 * 64 + 2 * 32) + 64) * 4 +
                                    q4(512, 64));
  EXPECT_EQ(mlx4.total_bytes(), 123952u);
}

// The byte model from config.json against the loaded model's own count: the two are
// written independently (one from the config's sizes, one from the tensors as loaded).
TEST(ByteModel, MatchesTheLoadedModelOnTheCpu) {
  const std::vector<fs::path> dirs = {test::fixtures_dir() / "llama",      test::fixtures_dir() / "qwen2",
                                      test::fixtures_dir() / "qwen3",      test::fixtures_dir() / "qwen3-mlx4",
                                      test::fixtures_dir() / "llama-mlx8", test::source_dir() / "models" / "demo",
                                      test::fixtures_dir() / "qwen3_moe",  test::fixtures_dir() / "qwen3_moe-step2",
                                      test::fixtures_dir() / "qwen3_moe-mlx4", test::fixtures_dir() / "qwen2-mlx4"};
  for (const fs::path& dir : dirs)
    for (KvCacheMode mode : {KvCacheMode::native, KvCacheMode::bf16, KvCacheMode::affine8, KvCacheMode::affine4})
      for (int64_t context : {0, 1, 300}) {
        const auto model = load_model(dir);
        const ByteModel m = count(ConfigJson::load(dir / "config.json"), context, mode, Device::cpu);
        EXPECT_EQ(m.total_bytes(), model->decode_bytes(context, mode))
            << dir.filename() << " " << kv_cache_mode_name(mode) << " context " << context;
      }
}

// The fp8 fixture quantizes lm_head too (scripts/make_fp8_fixture.py); published fp8
// checkpoints (DeepSeek-V3, Qwen3-FP8) keep it bf16 and config.json does not say which,
// so the byte model counts the published layout. The whole difference is lm_head.
TEST(ByteModel, Fp8FixtureDiffersOnlyByItsQuantizedLmHead) {
  const fs::path dir = test::fixtures_dir() / "qwen3-fp8";
  const auto model = load_model(dir);
  const ByteModel m = count(ConfigJson::load(dir / "config.json"), 7, KvCacheMode::native, Device::cpu);
  EXPECT_EQ(m.bucket("lm_head"), 512u * 64 * 4);
  EXPECT_EQ(m.total_bytes() - model->decode_bytes(7, KvCacheMode::native), 512u * 64 * 4 - (512u * 64 + 4 * 1 * 4));
}

TEST(ByteModel, BadInputIsAClearError) {
  json j = llama3_8b();
  j["model_type"] = "mamba";
  EXPECT_THROW(
      {
        try {
          count(config_of(j));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("model_type 'mamba'"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("deepseek_v3"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  json k = llama3_8b();
  k.erase("hidden_size");
  EXPECT_THROW(count(config_of(k)), Error);
  EXPECT_THROW(count(config_of(llama3_8b()), 0, KvCacheMode::native, Device::cuda, "int3"), Error);
  EXPECT_THROW(count(config_of(llama3_8b()), 0, KvCacheMode::native, Device::cuda, "int4", 48), Error);
}

// Sizes no model has are errors naming the field (or the total), never totals that
// wrapped around in uint64 or a loop over 2^40 layers.
TEST(ByteModel, AbsurdSizesAreErrorsNotWrappedTotals) {
  const auto message = [](const json& j, int64_t context = 0) -> std::string {
    try {
      count(config_of(j), context);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  json layers = llama3_8b();
  layers["num_hidden_layers"] = int64_t(1) << 40;
  EXPECT_NE(message(layers).find("num_hidden_layers 1099511627776"), std::string::npos) << message(layers);
  json wide = llama3_8b();
  wide["hidden_size"] = int64_t(1) << 40;
  EXPECT_NE(message(wide).find("hidden_size 1099511627776"), std::string::npos) << message(wide);
  json negative = deepseek_v3();
  negative["v_head_dim"] = -128;
  EXPECT_NE(message(negative).find("v_head_dim -128"), std::string::npos) << message(negative);
  json experts = qwen3_30b_a3b();
  experts["num_experts"] = -1;
  EXPECT_NE(message(experts).find("num_experts -1"), std::string::npos) << message(experts);
  // Each size allowed, the product not: 2^30 x 2^30 weights a matrix, in 2^16 layers.
  json huge = llama3_8b();
  huge["hidden_size"] = huge["intermediate_size"] = int64_t(1) << 30;
  huge["num_hidden_layers"] = 1 << 16;
  EXPECT_NE(message(huge).find("past the 2^53"), std::string::npos) << message(huge);
  EXPECT_NE(message(llama3_8b(), int64_t(1) << 60).find("--context 1152921504606846976"), std::string::npos);
  // The published shapes stay well inside.
  EXPECT_EQ(message(llama3_8b(), 1 << 20), "no error");
}

TEST(BytesCmd, JsonHasTotalBucketsAndRoofline) {
  const fs::path dir = test::temp_dir("cfg");
  test::write_file(dir / "config.json", llama3_8b().dump());
  auto r = test::run_mere("bytes -m " + dir.string() + " --context 8192 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["total_bytes"].get<uint64_t>(), 15009857536ull + 1073741824ull);
  EXPECT_EQ(j["buckets"]["lm_head"].get<uint64_t>(), 128256ull * 4096 * 2);
  EXPECT_NEAR(j["roofline_tok_s"].get<double>(), 4.287e12 / (15009857536.0 + 1073741824.0), 1e-6);

  // The config file itself, another bandwidth, the text table.
  r = test::run_mere("bytes -m " + (dir / "config.json").string() + " --bandwidth 1e12 --weights int4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("affine int4 g64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("routed_experts"), std::string::npos) << r.out;

  r = test::run_mere("bytes --kv-cache-mode affine9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-cache-mode affine9"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mere
