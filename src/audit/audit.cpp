#include "audit/audit.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "chat/chat_template.h"
#include "core/error.h"
#include "core/progress.h"
#include "engine/generate.h"
#include "engine/levers.h"
#include "io/config.h"
#include "models/model.h"
#include "quant/quantize_checkpoint.h"
#include "registry/runtime_settings.h"
#include "tokenizer/tokenizer.h"

namespace mere {
namespace {

namespace fs = std::filesystem;

// One configuration under test: the baseline, one lever, or all levers together.
struct Arm {
  std::vector<LeverSpec> specs;  // empty: the baseline
  fs::path dir;
  Levers levers;
  KvCacheMode kv = KvCacheMode::native;
  const Model* model = nullptr;
  ArmResult result;
  bool engaged() const { return model != nullptr; }
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The checkpoint revision: FNV-1a over config.json and each safetensors file's size and
// first 64 KiB (its header, which lists every tensor with its dtype, shape and offsets).
std::string revision_of(const fs::path& dir) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(p[i])) * 1099511628211ull;
  };
  std::vector<fs::path> files = {dir / "config.json"};
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin() + 1, files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string head(f.extension() == ".json" ? fs::file_size(f) : std::min<uintmax_t>(fs::file_size(f), 65536), '\0');
    in.read(head.data(), std::streamsize(head.size()));
    const std::string size = std::to_string(fs::file_size(f)) + f.filename().string();
    mix(size.data(), size.size());
    mix(head.data(), head.size());
  }
  return fmt::format("fnv1a64:{:016x}", h);
}

void set_engine_lever(Levers& l, const std::string& name, bool on) {
  if (name == "fused_norm_matvec" || name == "tensor_core_affine_gemm") {
    (name == "fused_norm_matvec" ? l.fused_norm_matvec : l.tensor_core_affine_gemm) = on ? LeverMode::on : LeverMode::off;
    return;
  }
  bool* field = name == "cuda_graphs"           ? &l.cuda_graphs
                : name == "pipelined_decode"    ? &l.pipelined_decode
                : name == "kernel_token_slots"  ? &l.kernel_token_slots
                : name == "fused_projections"   ? &l.fused_projections
                : name == "fused_rope_store"    ? &l.fused_rope_store
                : name == "programmatic_launch" ? &l.programmatic_launch
                : name == "matvec_split_k"      ? &l.matvec_split_k
                : name == "fp8_activation_gemm" ? &l.fp8_activation_gemm
                : name == "int8_activation_matvec" ? &l.int8_activation_matvec
                : name == "tensor_core_kv_attention" ? &l.tensor_core_kv_attention
                : name == "tensor_core_attention" ? &l.tensor_core_attention
                : name == "tensor_core_affine_matvec" ? &l.tensor_core_affine_matvec
                : name == "int16_activation_matvec" ? &l.int16_activation_matvec
                : name == "sixteen_token_matvec" ? &l.sixteen_token_matvec
                : name == "sixteen_token_experts" ? &l.sixteen_token_experts
                : name == "tensor_core_fp8_matvec" ? &l.tensor_core_fp8_matvec
                : name == "rope_in_attention" ? &l.rope_in_attention
                : name == "wide_attention_blocks" ? &l.wide_attention_blocks
                : name == "cluster_attention_merge" ? &l.cluster_attention_merge
                : name == "routing_in_experts" ? &l.routing_in_experts
                : name == "deep_moe_ring" ? &l.deep_moe_ring
                : name == "deep_dense_ring" ? &l.deep_dense_ring
                : name == "wide_batch_stages" ? &l.wide_batch_stages
                : name == "uneven_row_cuts" ? &l.uneven_row_cuts
                : name == "int4_byte_codes" ? &l.int4_byte_codes
                : name == "tensor_core_affine_moe_gemm" ? &l.tensor_core_affine_moe_gemm
                : name == "tensor_core_dense_moe_gemm" ? &l.tensor_core_dense_moe_gemm
                : name == "tensor_core_fp8_gemm" ? &l.tensor_core_fp8_gemm
                : name == "grouped_swiglu_epilogue" ? &l.grouped_swiglu_epilogue
                : name == "formed_gemm_input" ? &l.formed_gemm_input
                : name == "split_sum_kernel" ? &l.split_sum_kernel
                : name == "streamed_weights" ? &l.streamed_weights
                : name == "cpu_direct_matvec" ? &l.cpu_direct_matvec
                : name == "cpu_tiled_matmul" ? &l.cpu_tiled_matmul
                : name == "cpu_vnni_matvec" ? &l.cpu_vnni_matvec
                : name == "cpu_vector_attention" ? &l.cpu_vector_attention
                : name == "cpu_avx512_matmul" ? &l.cpu_avx512_matmul
                : name == "cpu_packed_matmul" ? &l.cpu_packed_matmul
                : name == "cpu_avx512_attention" ? &l.cpu_avx512_attention
                                                : nullptr;
  MERE_CHECK(field != nullptr, "--lever {}=...: unknown engine lever", name);
  *field = on;
}

std::string arm_label(const std::vector<LeverSpec>& specs) {
  std::string s;
  for (const LeverSpec& l : specs) s += (s.empty() ? "" : " + ") + l.text;
  return s.empty() ? "baseline" : s;
}

// Text decoded from a slice of tokens may start or end inside a UTF-8 character:
// invalid bytes become U+FFFD, so the reports stay valid UTF-8.
std::string valid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (uint8_t(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;  // Linux reports KiB
}

class Auditor {
 public:
  explicit Auditor(const AuditOptions& o) : o_(o) {}

  AuditReport run() {
    read_inputs();
    prepare_arms();
    measure_memory();
    timed_runs();
    sampled_runs();
    teacher_forced();
    return finish();
  }

 private:
  void read_inputs() {
    MERE_CHECK(o_.max_new_tokens >= 4, "-n {}: the audit needs at least 4 tokens per prompt (decode tok/s is "
               "timed from the second token on)", o_.max_new_tokens);
    MERE_CHECK(o_.runs >= 1, "--runs {}: at least 1", o_.runs);
    MERE_CHECK(o_.corpus_tokens >= 2, "--corpus-tokens {}: at least 2", o_.corpus_tokens);
    MERE_CHECK(o_.window >= 2, "--window {}: at least 2", o_.window);
    // At 0 or below the sampled comparison would repeat the greedy one; NaN would hang a sampler.
    MERE_CHECK(o_.temperature > 0 && std::isfinite(o_.temperature),
               "--temperature {}: the sampled comparison needs a finite temperature above 0", o_.temperature);
    for (const std::string& t : o_.levers) {
      specs_.push_back(parse_lever(t));
      for (size_t i = 0; i + 1 < specs_.size(); ++i)
        MERE_CHECK(specs_[i].text != t, "--lever {}: given twice", t);
    }
    MERE_CHECK(!specs_.empty(), "no --lever given: name at least one, e.g. --lever kv=affine8 --lever weights=int4");
    report_.prompts = load_prompts(o_.prompts_file);
    corpus_text_ = read_text_file(o_.corpus_file, "--corpus");
    MERE_CHECK(fs::exists(o_.model_dir / "config.json"), "-m {}: no config.json", o_.model_dir.string());
    fs::create_directories(o_.out_dir);

    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(o_.model_dir));
    std::optional<ChatTemplate> chat;
    for (const AuditPrompt& p : report_.prompts) {
      std::vector<int32_t> ids;
      if (p.text) {
        ids = tokenizer_->encode(*p.text, /*add_special_tokens=*/true);
      } else {
        if (!chat) {
          try {
            chat = ChatTemplate::from_tokenizer_config(o_.model_dir);
          } catch (const Error& e) {
            fail("{}: \"messages\" needs the model's chat template: {}", p.source, e.what());
          }
        }
        // The template writes BOS itself where the model wants one (apply_chat_template's rule).
        ids = tokenizer_->encode(chat->render(*p.messages, nullptr, /*add_generation_prompt=*/true),
                                 /*add_special_tokens=*/false);
      }
      MERE_CHECK(!ids.empty(), "{}: the prompt has no tokens", p.source);
      prompt_ids_.push_back(std::move(ids));
    }
    corpus_ = tokenizer_->encode(corpus_text_, /*add_special_tokens=*/false);
    if (int64_t(corpus_.size()) > o_.corpus_tokens) corpus_.resize(size_t(o_.corpus_tokens));
    MERE_CHECK(corpus_.size() >= 2, "--corpus {}: {} token(s); at least 2 are needed", o_.corpus_file.string(),
               corpus_.size());
  }

  const Model& load(const fs::path& dir, const Levers& levers) {
    const LoadOptions lo = levers.load_options(o_.device);
    // Every load option, so that levers that only change how a model runs share its load.
    const std::vector<int> settings{lo.fuse_projections,
                                    lo.fuse_rope_store, lo.rope_in_attention, lo.wide_attention_blocks,
                                    lo.cluster_attention_merge,
                                    int(lo.fuse_norm_matvec), lo.programmatic_launch,
                                    lo.matvec_split_k, lo.fp8_activation_gemm, lo.int8_activation_matvec,
                                    lo.tensor_core_kv_attention, lo.tensor_core_attention,
                                    lo.tensor_core_affine_matvec,
                                    lo.int16_activation_matvec, lo.sixteen_token_matvec, lo.sixteen_token_experts,
                                    lo.tensor_core_fp8_matvec,
                                    int(lo.tensor_core_affine_gemm), lo.tensor_core_affine_moe_gemm,
                                    lo.tensor_core_dense_moe_gemm, lo.tensor_core_fp8_gemm, lo.grouped_swiglu_epilogue,
                                    lo.formed_gemm_input, lo.split_sum_kernel,
                                    lo.routing_in_experts,
                                    lo.deep_moe_ring, lo.deep_dense_ring, lo.wide_batch_stages, lo.uneven_row_cuts,
                                    lo.int4_byte_codes,
                                    lo.streamed_weights, lo.cpu_direct_matvec, lo.cpu_tiled_matmul, lo.cpu_vnni_matvec,
                                    lo.cpu_vector_attention, lo.cpu_avx512_matmul, lo.cpu_packed_matmul,
                                    lo.cpu_avx512_attention};
    const std::string key = fmt::format("{}|{}", dir.string(), fmt::join(settings, ","));
    auto it = models_.find(key);
    if (it == models_.end()) {
      std::fprintf(stderr, "loading %s\n", dir.c_str());
      it = models_.emplace(key, load_model(dir, o_.device, lo)).first;
    }
    return *it->second;
  }

  // A quantized copy of the checkpoint under --out/scratch, made with mere quantize's code.
  fs::path quantized_dir(const LeverSpec& s) {
    const fs::path dir = o_.out_dir / "scratch" /
                         (s.weights == "fp8" ? std::string("weights-fp8")
                                             : fmt::format("weights-{}-g{}", s.weights, s.group_size));
    auto done = quantized_.find(dir.string());
    if (done != quantized_.end()) return dir;
    fs::remove_all(dir);
    fs::create_directories(dir.parent_path());
    quantize_checkpoint(o_.model_dir, dir, {s.weights == "int8" ? 8 : 4, s.group_size, s.weights == "fp8", {}});
    quantized_.insert({dir.string(), true});
    return dir;
  }

  void setup(Arm& arm) {
    arm.dir = o_.model_dir;
    arm.levers = Levers{};
    arm.result.label = arm_label(arm.specs);
    try {
      for (const LeverSpec& s : arm.specs) {
        switch (s.kind) {
          case LeverSpec::Kind::kv: arm.kv = s.kv_mode; break;
          case LeverSpec::Kind::weights:
            arm.dir = quantized_dir(s);
            break;
          case LeverSpec::Kind::engine:
            if (o_.device != engine_lever_device(s.engine_lever)) {
              const bool cpu = o_.device == Device::cpu;
              arm.result.not_applicable = true;
              arm.result.not_engaged = fmt::format(
                  "{} is a lever of the {} backend; on the {} it has no effect, so there is nothing to measure",
                  s.engine_lever, cpu ? "CUDA" : "CPU", cpu ? "CPU" : "GPU");
              return;
            }
            set_engine_lever(arm.levers, s.engine_lever, s.engine_on);
            break;
        }
      }
      RuntimeSettings settings;
      settings.kv_cache_mode = arm.kv;
      check_engageable(settings, o_.device);
      arm.model = &load(arm.dir, arm.levers);
    } catch (const Error& e) {
      arm.result.not_engaged = e.what();
      arm.model = nullptr;
    }
  }

  void prepare_arms() {
    baseline_.levers = Levers{};
    baseline_.dir = o_.model_dir;
    baseline_.result.label = "baseline";
    baseline_.model = &load(o_.model_dir, baseline_.levers);
    const Model& m = *baseline_.model;
    report_.model_type = m.info().model_type;
    int64_t longest = 0;
    for (size_t i = 0; i < prompt_ids_.size(); ++i) {
      const int64_t n = int64_t(prompt_ids_[i].size());
      MERE_CHECK(n + o_.max_new_tokens < m.info().max_positions,
                 "{}: {} prompt tokens + {} to generate exceed the model's context of {}", report_.prompts[i].source,
                 n, o_.max_new_tokens, m.info().max_positions);
      report_.prompt_tokens.push_back(n);
      if (n > longest) longest_ = i;
      longest = std::max(longest, n);
    }
    capacity_ = longest + o_.max_new_tokens + 1;
    auto arm_of = [](std::vector<LeverSpec> specs) {
      Arm a;
      a.specs = std::move(specs);
      return a;
    };
    for (const LeverSpec& s : specs_) arms_.push_back(arm_of({s}));
    // The combination: the last lever given of each kind (one KV mode, one weight format,
    // each engine lever once), in the order given.
    std::vector<LeverSpec> combined;
    for (size_t i = 0; i < specs_.size(); ++i) {
      auto same_kind = [&](const LeverSpec& x) {
        return x.kind == specs_[i].kind && x.engine_lever == specs_[i].engine_lever;
      };
      if (std::none_of(specs_.begin() + long(i) + 1, specs_.end(), same_kind)) combined.push_back(specs_[i]);
    }
    if (o_.combine && combined.size() > 1) arms_.push_back(arm_of(combined));
    for (Arm& a : arms_) setup(a);
    for (Arm* a : all()) {
      ArmResult& r = a->result;
      r.kv_mode = std::string(kv_cache_mode_name(a->kv));
      r.model_dir = a->dir.string();
      if (!a->engaged()) continue;
      r.weights = a->model->info().weights;
      r.levers = a->levers.describe(o_.device);
    }
  }

  std::vector<Arm*> all() {
    std::vector<Arm*> v = {&baseline_};
    for (Arm& a : arms_) v.push_back(&a);
    return v;
  }
  std::vector<Arm*> engaged() {
    std::vector<Arm*> v;
    for (Arm* a : all())
      if (a->engaged()) v.push_back(a);
    return v;
  }

  void measure_memory() {
    for (Arm* a : engaged()) {
      ArmResult& r = a->result;
      const Model& m = *a->model;
      r.weight_bytes = m.info().weight_bytes;
      // The performance model's count of the cache: what decode_bytes adds for a full context.
      r.cache_capacity_tokens = m.info().max_positions;
      r.cache_capacity_bytes = m.decode_bytes(r.cache_capacity_tokens, a->kv) - m.decode_bytes(0, a->kv);
      // And the real allocation, at the capacity the audit's own runs use.
      auto state = m.make_state(capacity_, a->kv);
      state->reserve(capacity_);
      r.cache_measured_tokens = capacity_;
      r.cache_measured_bytes = state->kv_bytes();
      state.reset();
      if (o_.device == Device::cpu) {
        SamplingParams greedy;
        greedy.temperature = 0;
        const uint64_t before = host_tensor_bytes_live();
        reset_host_tensor_bytes_peak();
        generate_once(*a, prompt_ids_[longest_], o_.max_new_tokens, greedy, nullptr);
        const uint64_t peak = host_tensor_bytes_peak() - before;
        r.workspace_bytes = peak > r.cache_measured_bytes ? peak - r.cache_measured_bytes : 0;
      }
    }
  }

  GenerateStats generate_once(const Arm& a, const std::vector<int32_t>& prompt, int n, const SamplingParams& sampling,
                              std::vector<int32_t>* tokens) {
    GenerateOptions g;
    g.max_new_tokens = n;
    g.sampling = sampling;
    g.levers = a.levers;
    g.kv_cache_mode = a.kv;  // no EOS: every run yields n tokens, so both sides are compared over the same budget
    return generate(*a.model, prompt, g, [&](int32_t id) {
      if (tokens) tokens->push_back(id);
      return true;
    });
  }

  void timed_runs() {
    std::vector<Arm*> arms = engaged();
    SamplingParams greedy;
    greedy.temperature = 0;
    {
      Progress warm("audit warm-up", int64_t(arms.size()));
      for (size_t i = 0; i < arms.size(); ++i) {
        generate_once(*arms[i], prompt_ids_.front(), std::min(o_.max_new_tokens, 8), greedy, nullptr);
        warm.update(int64_t(i + 1), arms[i]->result.label);
      }
    }
    const int64_t total = int64_t(o_.runs) * int64_t(arms.size()) * int64_t(prompt_ids_.size());
    Progress progress(fmt::format("audit greedy runs ({} x {} arms x {} prompts, {} tokens)", o_.runs, arms.size(),
                                  prompt_ids_.size(), o_.max_new_tokens),
                      total);
    int64_t done = 0;
    for (int run = 0; run < o_.runs; ++run) {
      // Alternate the order so that drift (heat, other load) falls on every arm alike.
      std::vector<Arm*> order = arms;
      if (run % 2) std::reverse(order.begin(), order.end());
      for (Arm* a : order) {
        double prompt_tokens = 0, prefill_ms = 0, decode_tokens = 0, decode_ms = 0, ttft_ms = 0;
        for (size_t p = 0; p < prompt_ids_.size(); ++p) {
          std::vector<int32_t> tokens;
          const GenerateStats s = generate_once(*a, prompt_ids_[p], o_.max_new_tokens, greedy, &tokens);
          prompt_tokens += double(s.prompt_tokens);
          prefill_ms += s.prefill_ms;
          decode_tokens += double(std::max<int64_t>(s.generated_tokens - 2, 0));
          decode_ms += s.decode_ms;
          ttft_ms += s.ttft_ms;
          if (run == 0) a->result.greedy.push_back(std::move(tokens));
          else if (tokens != a->result.greedy[p] && !nondeterministic_)
            nondeterministic_ = "greedy tokens of " + a->result.label + " differed between runs";
          progress.update(++done, a->result.label);
        }
        a->result.prefill_tok_s.push_back(prefill_ms > 0 ? prompt_tokens * 1e3 / prefill_ms : 0);
        a->result.decode_tok_s.push_back(decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0);
        a->result.ttft_ms.push_back(ttft_ms / double(prompt_ids_.size()));
      }
    }
    progress.finish();
    for (Arm* a : arms) {
      a->result.prefill = spread_of(a->result.prefill_tok_s);
      a->result.decode = spread_of(a->result.decode_tok_s);
      a->result.ttft = spread_of(a->result.ttft_ms);
    }
  }

  void sampled_runs() {
    std::vector<Arm*> arms = engaged();
    SamplingParams sampled;
    sampled.temperature = o_.temperature;
    sampled.seed = o_.seed;
    Progress progress(fmt::format("audit sampled runs (temperature {}, seed {})", o_.temperature, o_.seed),
                      int64_t(arms.size() * prompt_ids_.size()));
    int64_t done = 0;
    for (Arm* a : arms)
      for (const auto& prompt : prompt_ids_) {
        std::vector<int32_t> tokens;
        generate_once(*a, prompt, o_.max_new_tokens, sampled, &tokens);
        a->result.sampled.push_back(std::move(tokens));
        progress.update(++done, a->result.label);
      }
  }

  // The logits after each token of `window`, fed one decode step at a time: [T, vocab] on the CPU.
  static Tensor decode_step_logits(const Model& m, const std::vector<int32_t>& window, SeqState& state) {
    const int64_t vocab = m.info().vocab;
    Tensor out = Tensor::empty({int64_t(window.size()), vocab}, DType::f32);
    for (size_t i = 0; i < window.size(); ++i) {
      const Tensor row = m.forward({window[i]}, state, false).to_device(Device::cpu);
      std::copy(row.data<float>(), row.data<float>() + vocab, out.data<float>() + int64_t(i) * vocab);
    }
    return out;
  }

  // Teacher-forced over the corpus in windows: every arm sees the same tokens, each
  // position's next-token distribution is compared with the baseline's.
  void teacher_forced() {
    std::vector<Arm*> arms = engaged();
    const int64_t n = int64_t(corpus_.size());
    const int64_t w = std::min<int64_t>(o_.window, baseline_.model->info().max_positions);
    const int64_t vocab = baseline_.model->info().vocab;
    const int64_t windows = (n + w - 1) / w;
    std::vector<double> nll(arms.size(), 0.0);
    kl_.assign(arms.size(), {});
    int64_t scored = 0;
    Progress progress(fmt::format("audit teacher-forced ({} corpus tokens, windows of {})", n, w),
                      windows * int64_t(arms.size()));
    int64_t done = 0;
    for (int64_t begin = 0; begin < n; begin += w) {
      const int64_t end = std::min(begin + w, n);
      if (end - begin < 2) break;
      const std::vector<int32_t> window(corpus_.begin() + begin, corpus_.begin() + end);
      std::vector<Tensor> logits;
      for (Arm* a : arms) {
        auto state = a->model->make_state(end - begin, a->kv);
        logits.push_back(o_.decode_steps ? decode_step_logits(*a->model, window, *state)
                                         : a->model->forward(window, *state, /*all_logits=*/true).to_device(Device::cpu));
        progress.update(++done, a->result.label);
      }
      const float* base = logits[0].data<float>();  // arms[0] is the baseline
      for (int64_t i = 0; i + 1 < end - begin; ++i) {
        for (size_t k = 0; k < arms.size(); ++k) {
          const PositionCompare c =
              compare_logits(base + i * vocab, logits[k].data<float>() + i * vocab, vocab, window[size_t(i + 1)]);
          nll[k] += c.nll_lever;
          if (k > 0) kl_[k].push_back(c.kl);
        }
        ++scored;
      }
      ++report_.windows;
    }
    progress.finish();
    report_.corpus_tokens_scored = scored;
    for (size_t k = 0; k < arms.size(); ++k) arms[k]->result.ppl = scored > 0 ? std::exp(nll[k] / double(scored)) : 0;
    for (size_t k = 0; k < arms.size(); ++k) kl_by_label_[arms[k]->result.label] = std::move(kl_[k]);
  }

  LeverComparison compare(const Arm& a) {
    LeverComparison c;
    c.lever = a.result.label;
    const ArmResult& b = baseline_.result;
    if (!a.engaged()) {
      c.verdict = decide({}, a.result.not_engaged, a.result.not_applicable);
      return c;
    }
    for (size_t p = 0; p < prompt_ids_.size(); ++p) {
      c.greedy.push_back(compare_tokens(b.greedy[p], a.result.greedy[p]));
      c.sampled.push_back(compare_tokens(b.sampled[p], a.result.sampled[p]));
      const TokenParity& g = c.greedy.back();
      if (g.first_divergence >= 0 && c.excerpts.size() < 3) {
        // From a few tokens before the divergence, so the reader sees where the texts part.
        const size_t from = size_t(std::max<int64_t>(g.first_divergence - 6, 0));
        auto text = [&](const std::vector<int32_t>& t) {
          const size_t to = std::min(t.size(), size_t(g.first_divergence) + 24);
          return valid_utf8(
              tokenizer_->decode(std::vector<int32_t>(t.begin() + long(std::min(from, t.size())), t.begin() + long(to))));
        };
        c.excerpts.push_back({report_.prompts[p].name, text(b.greedy[p]), text(a.result.greedy[p]),
                              g.first_divergence});
      }
    }
    c.greedy_match_rate = match_rate(c.greedy);
    c.sampled_match_rate = match_rate(c.sampled);
    c.kl = kl_stats(kl_by_label_[a.result.label]);
    LeverFigures f;
    f.greedy_match_rate = c.greedy_match_rate;
    f.kl_mean = c.kl.mean;
    f.kl_p99 = c.kl.p99;
    f.kl_max = c.kl.max;
    f.ppl_baseline = b.ppl;
    f.ppl_lever = a.result.ppl;
    f.decode_baseline = b.decode.median;
    f.decode_lever_max = a.result.decode.max;
    f.decode_lever = a.result.decode.median;
    f.decode_lever_min = a.result.decode.min;
    f.prefill_baseline = b.prefill.median;
    f.prefill_lever_max = a.result.prefill.max;
    f.prefill_lever = a.result.prefill.median;
    f.prefill_lever_min = a.result.prefill.min;
    f.speed_runs = o_.runs;
    f.resident_baseline = double(b.weight_bytes + b.cache_capacity_bytes);
    f.resident_lever = double(a.result.weight_bytes + a.result.cache_capacity_bytes);
    c.verdict = decide(f);
    return c;
  }

  AuditReport finish() {
    report_.date = utc_now();
    report_.model_label = o_.model_label;
    report_.model_dir = o_.model_dir.string();
    report_.revision = revision_of(o_.model_dir);
    report_.device = o_.device == Device::cpu ? "cpu" : cuda_device_description();
    report_.speed_label = o_.device == Device::cpu ? "CPU" : "GPU";
    report_.options = o_;
    report_.baseline = baseline_.result;
    for (Arm& a : arms_) {
      report_.comparisons.push_back(compare(a));
      report_.arms.push_back(a.result);
    }
    report_.peak_rss_bytes = peak_rss_bytes();
    if (nondeterministic_) report_.notes.push_back("not deterministic: " + *nondeterministic_);
    report_.notes.push_back(
        "EOS does not stop generation in the audit: every prompt yields exactly -n tokens on every arm");
    report_.notes.push_back(
        "sampled agreement is fragile by construction: the sampler inverts the CDF in token-id order, so a small "
        "change in the probability of any earlier token moves the boundary a draw falls on; expect early sampled "
        "divergence even at rounding-level KL (--lever kv=default, the baseline itself, is the A/A control)");
    if (o_.runs < kMinSpeedRuns)
      report_.notes.push_back(fmt::format("speed is reported but not judged in the verdicts: {} timed run(s), the "
                                          "policy needs {}",
                                          o_.runs, kMinSpeedRuns));
    if (o_.device == Device::cpu)
      report_.notes.push_back(
          "workspace: the most CPU tensor bytes alive at once during a greedy generation of the longest prompt, "
          "beyond those alive before it and its cache; memory-mapped weights are not allocations and do not count");
    else
      report_.notes.push_back(
          "workspace is not measured on CUDA: the caching device allocator keeps no per-run peak; the process's "
          "peak host resident set is reported instead");
    return std::move(report_);
  }

  AuditOptions o_;
  std::vector<LeverSpec> specs_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<int32_t>> prompt_ids_;
  std::string corpus_text_;
  std::vector<int32_t> corpus_;
  std::map<std::string, std::unique_ptr<Model>> models_;
  std::map<std::string, bool> quantized_;
  Arm baseline_;
  std::vector<Arm> arms_;
  int64_t capacity_ = 0;
  size_t longest_ = 0;  // the longest prompt
  std::vector<std::vector<double>> kl_;
  std::map<std::string, std::vector<double>> kl_by_label_;
  std::optional<std::string> nondeterministic_;
  AuditReport report_;
};

}  // namespace

AuditReport run_audit(const AuditOptions& options) { return Auditor(options).run(); }

}  // namespace mere
