#include "audit/inputs.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mere {

namespace fs = std::filesystem;

std::vector<std::string> engine_lever_names() {
  return {"cuda_graphs",       "pipelined_decode",    "kernel_token_slots", "fused_projections", "fused_rope_store",
          "fused_norm_matvec", "programmatic_launch", "matvec_split_k",    "fp8_activation_gemm",
          "int8_activation_matvec", "tensor_core_kv_attention", "tensor_core_attention", "tensor_core_affine_matvec",
          "int16_activation_matvec", "sixteen_token_matvec", "sixteen_token_experts", "tensor_core_fp8_matvec",
          "tensor_core_affine_gemm", "tensor_core_affine_moe_gemm", "tensor_core_dense_moe_gemm",
          "tensor_core_fp8_gemm",
          "grouped_swiglu_epilogue", "formed_gemm_input", "split_sum_kernel",
          "rope_in_attention", "wide_attention_blocks", "cluster_attention_merge",
          "routing_in_experts", "deep_moe_ring", "deep_dense_ring", "wide_batch_stages", "uneven_row_cuts",
          "int4_byte_codes",
          "streamed_weights", "cpu_direct_matvec", "cpu_tiled_matmul",
          "cpu_vnni_matvec", "cpu_vector_attention", "cpu_avx512_matmul",
          "cpu_packed_matmul", "cpu_avx512_attention"};
}

Device engine_lever_device(const std::string& name) {
  return name.rfind("cpu_", 0) == 0 ? Device::cpu : Device::cuda;  // the CPU levers are named cpu_*
}

LeverSpec parse_lever(const std::string& text) {
  const size_t eq = text.find('=');
  MERE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
             "--lever '{}': expected NAME=VALUE, e.g. kv=affine8, weights=int4, weights=int4:g32, "
             "fused_projections=on",
             text);
  LeverSpec s;
  s.text = text;
  const std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  if (name == "kv" || name == "kv_cache_mode") {
    auto mode = parse_kv_cache_mode(value);
    MERE_CHECK(mode, "--lever {}: KV cache mode '{}'; expected {}", text, value, kKvCacheModeNames);
    s.kind = LeverSpec::Kind::kv;
    s.kv_mode = *mode;
    return s;
  }
  if (name == "weights") {
    s.kind = LeverSpec::Kind::weights;
    const size_t colon = value.find(':');
    s.weights = value.substr(0, colon);
    MERE_CHECK(s.weights == "int8" || s.weights == "int4" || s.weights == "fp8",
               "--lever {}: weights '{}'; expected int8, int4 or fp8 (int8/int4 optionally with :g32, :g64 or :g128)",
               text, s.weights);
    if (colon != std::string::npos) {
      const std::string g = value.substr(colon + 1);
      MERE_CHECK(s.weights != "fp8" && (g == "g32" || g == "g64" || g == "g128"),
                 "--lever {}: '{}' after ':'; int8 and int4 take a group size g32, g64 or g128", text, g);
      s.group_size = std::stoi(g.substr(1));
    }
    return s;
  }
  for (const std::string& lever : engine_lever_names())
    if (name == lever) {
      MERE_CHECK(value == "on" || value == "off" || value == "1" || value == "0",
                 "--lever {}: '{}'; engine levers take on or off", text, value);
      s.kind = LeverSpec::Kind::engine;
      s.engine_lever = name;
      s.engine_on = value == "on" || value == "1";
      return s;
    }
  std::string names;
  for (const std::string& n : engine_lever_names()) names += ", " + n;
  fail("--lever {}: unknown lever '{}'; known: kv, weights{}", text, name, names);
}

std::string read_text_file(const fs::path& file, const char* what) {
  std::error_code ec;
  MERE_CHECK(fs::is_regular_file(file, ec), "{} {}: no such file", what, file.string());
  std::ifstream in(file, std::ios::binary);
  MERE_CHECK(in.good(), "{} {}: cannot open", what, file.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<AuditPrompt> load_prompts(const fs::path& file) {
  std::istringstream in(read_text_file(file, "--prompts"));
  std::vector<AuditPrompt> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", file.string(), n);
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers past a double
      fail("{}: not valid JSON ({})", where, e.what());
    }
    MERE_CHECK(j.is_object(), "{}: expected a JSON object with \"prompt\" or \"messages\", got {}", where,
               j.type_name());
    AuditPrompt p;
    p.source = where;
    for (auto it = j.begin(); it != j.end(); ++it)
      MERE_CHECK(it.key() == "prompt" || it.key() == "messages" || it.key() == "name" || it.key() == "kind",
                 "{}: unknown field \"{}\" (expected prompt or messages, and optionally name and kind)", where,
                 it.key());
    MERE_CHECK(j.contains("prompt") != j.contains("messages"), "{}: give exactly one of \"prompt\" and \"messages\"",
               where);
    if (j.contains("prompt")) {
      MERE_CHECK(j["prompt"].is_string() && !j["prompt"].get<std::string>().empty(),
                 "{}: field \"prompt\" must be a non-empty string", where);
      p.text = j["prompt"].get<std::string>();
    } else {
      const auto& m = j["messages"];
      MERE_CHECK(m.is_array() && !m.empty(), "{}: field \"messages\" must be a non-empty array", where);
      for (size_t i = 0; i < m.size(); ++i)
        MERE_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string() && m[i].contains("content") &&
                       m[i]["content"].is_string(),
                   "{}: messages[{}] must be an object with string \"role\" and \"content\"", where, i);
      p.messages = m;
    }
    for (const char* key : {"name", "kind"})
      MERE_CHECK(!j.contains(key) || j[key].is_string(), "{}: field \"{}\" must be a string", where, key);
    p.name = j.contains("name") ? j["name"].get<std::string>() : fmt::format("line {}", n);
    p.kind = j.contains("kind") ? j["kind"].get<std::string>() : p.text ? "prompt" : "chat";
    prompts.push_back(std::move(p));
  }
  MERE_CHECK(!prompts.empty(), "--prompts {}: no prompts (one JSON object per line)", file.string());
  return prompts;
}

fs::path default_prompts_file() { return fs::path(MERE_SOURCE_DIR) / "data" / "audit" / "prompts.jsonl"; }
fs::path default_corpus_file() { return fs::path(MERE_SOURCE_DIR) / "data" / "audit" / "corpus.txt"; }

}  // namespace mere
