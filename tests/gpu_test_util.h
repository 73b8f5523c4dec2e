// Helpers the GPU tests share: seeded random tensors and MLX affine weights,
// copies to the GPU, the relative error they report ("[ gpu ]" lines) and
// assert on, and kernel timing.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/device.h"
#include "engine/decode_step.h"
#include "engine/levers.h"
#include "models/model.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/ops.h"
#include "ops/weight.h"
#include "sampling/device_sampler.h"
#include "test_util.h"

namespace mere::test {

// A GPU test's fixture: it fails (never skips) where there is no GPU, so that a
// GPU run cannot pass by running nothing.
template <typename Base = ::testing::Test>
class NeedsGpu : public Base {
 protected:
  void SetUp() override {
    if (!cuda_available()) FAIL() << "gpu tests need a GPU: " << cuda_device_description();
  }
};

// The same, starting and ending at the default launch settings (for tests that
// change them through ops::set_launch_settings).
class NeedsGpuDefaultLaunch : public NeedsGpu<> {
 protected:
  void SetUp() override {
    NeedsGpu::SetUp();
    if (!HasFatalFailure()) ops::set_launch_settings({});
    ops::set_decode_keys(0);
  }
  void TearDown() override {
    ops::set_launch_settings({});
    ops::set_decode_keys(0);
  }
};

// offset + scale * u, u uniform in [-1, 1), from a counter-based hash of the seed (CPU).
inline Tensor random(Shape shape, DType dt, uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  ops::fill_random(t, seed, scale, offset);
  return t;
}

inline Tensor gpu(const Tensor& t) { return t.to_device(Device::cuda); }

// Split-K attention's partials on the CPU, as o_proj's fused input takes them:
// random maxima, sums and outputs [T, heads, splits(, head_dim)], every third
// split of a row after its first empty (max -inf, as the last splits of a short
// context are).
inline ops::AttentionSplits random_attention_splits(int64_t T, int64_t heads, int64_t splits, int64_t head_dim) {
  ops::AttentionSplits s{.max = random({T, heads, splits}, DType::f32, 21, 4.0f),
                         .sum = random({T, heads, splits}, DType::f32, 22, 20.0f, 30.0f),
                         .out = random({T, heads, splits, head_dim}, DType::f32, 23, 10.0f)};
  for (int64_t r = 0; r < T * heads; ++r)
    for (int64_t k = 1; k < splits; k += 3) s.max.data<float>()[r * splits + k] = -INFINITY;
  return s;
}

// Those partials merged on the CPU in double: [T, heads * head_dim].
inline Tensor merged_on_cpu(const ops::AttentionSplits& s) {
  const int64_t T = s.out.dim(0), heads = s.out.dim(1), splits = s.out.dim(2), head_dim = s.out.dim(3);
  Tensor merged = Tensor::empty({T, heads * head_dim}, DType::f32);
  for (int64_t r = 0; r < T * heads; ++r) {
    const float* m = s.max.data<float>() + r * splits;
    const float* l = s.sum.data<float>() + r * splits;
    const float* o = s.out.data<float>() + r * splits * head_dim;
    const double top = *std::max_element(m, m + splits);
    for (int64_t d = 0; d < head_dim; ++d) {
      double num = 0, den = 0;
      for (int64_t k = 0; k < splits; ++k) {
        if (m[k] == -INFINITY) continue;
        num += double(o[k * head_dim + d]) * std::exp(double(m[k]) - top);
        den += double(l[k]) * std::exp(double(m[k]) - top);
      }
      merged.data<float>()[r * head_dim + d] = float(num / den);
    }
  }
  return merged;
}

// Partials as a wide attention grid leaves them, on the GPU: only the first
// `live` splits of each row written. `marked` holds the rest marked empty (max
// -inf), as attention marks them; `garbage` holds a huge max and NaN outputs
// there, with AttentionSplits::live set, so a merge that read past `live` would
// be poisoned. A fused form must give the same sums from both.
struct LiveSplits {
  ops::AttentionSplits marked, garbage;
};
inline LiveSplits live_splits_on_gpu(const ops::AttentionSplits& cpu, int64_t live) {
  const int64_t rows = cpu.out.dim(0) * cpu.out.dim(1), splits = cpu.out.dim(2), head_dim = cpu.out.dim(3);
  Tensor marked_max = cpu.max.clone(), garbage_max = cpu.max.clone(), garbage_out = cpu.out.clone();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = live; s < splits; ++s) {
      marked_max.data<float>()[r * splits + s] = -INFINITY;
      garbage_max.data<float>()[r * splits + s] = 1e30f;
      for (int64_t d = 0; d < head_dim; ++d) garbage_out.data<float>()[(r * splits + s) * head_dim + d] = NAN;
    }
  const Tensor sum = gpu(cpu.sum);
  LiveSplits out{.marked = {.max = gpu(marked_max), .sum = sum, .out = gpu(cpu.out)},
                 .garbage = {.max = gpu(garbage_max), .sum = sum, .out = gpu(garbage_out)}};
  out.garbage.live = int(live);
  return out;
}

// An MLX affine weight [out, in] (CPU) of random codes; scales near 1e-2 and
// biases near -scale 2^(bits-1), so the weights centre on zero as a quantized
// trained matrix's do.
inline AffineWeight random_affine(int64_t out, int64_t in, int bits, int group, DType dt, uint64_t seed) {
  Tensor packed = Tensor::empty({out, in * bits / 32}, DType::u32);
  ops::fill_random_bytes(packed, seed, 0xff);
  const float s0 = 1e-2f;
  Tensor scales = random({out, in / group}, dt, seed + 1, 0.5f * s0, s0);
  Tensor biases = random({out, in / group}, dt, seed + 2, s0, -s0 * float(1 << (bits - 1)));
  return AffineWeight{packed, scales, biases, bits, group};
}

// The launchers' view of an affine weight of `in` columns (on the GPU).
inline cuda::AffineArgs affine_args(const AffineWeight& a, int64_t in) {
  return {static_cast<const uint32_t*>(a.packed.raw()), a.scales.raw(), a.biases.raw(), a.scales.dtype(), a.bits,
          a.group_size, in, a.packed.dim(0)};
}

// x as lever int16_activation_matvec rounds it: per token and group, scaled by
// the power of two that puts its largest |x| in [2^13, 2^14), rounded to an
// integer (half to even) and scaled back.
inline Tensor int16_rounded(const Tensor& x, int64_t group) {
  Tensor r = Tensor::empty(x.shape(), DType::f32);
  const float* src = x.data<float>();
  float* dst = r.data<float>();
  for (int64_t b = 0; b < x.numel(); b += group) {
    float amax = 0;
    for (int64_t i = b; i < b + group; ++i) amax = std::max(amax, std::fabs(src[i]));
    int exponent = 0;
    std::frexp(amax, &exponent);  // amax in [2^(exponent - 1), 2^exponent)
    exponent = amax > 0 ? std::max(exponent, -100) : 0;
    for (int64_t i = b; i < b + group; ++i)
      dst[i] = std::ldexp(std::nearbyint(std::ldexp(src[i], 14 - exponent)), exponent - 14);
  }
  return r;
}

// max |got - want| / max |want|, printed with the case unless `print` is false; a
// non-finite element of `got` is a failure and gives infinity.
inline float relative_error(const Tensor& got_device, const Tensor& want, const std::string& label,
                            bool print = true) {
  Tensor got = got_device.to_device(Device::cpu);
  EXPECT_EQ(got.shape(), want.shape()) << label;
  const float max_ref = std::max(1e-30f, test::max_abs(want));
  for (int64_t i = 0; i < got.numel(); ++i)
    if (!std::isfinite(got.at(i))) {
      ADD_FAILURE() << label << ": element " << i << " is " << got.at(i);
      return std::numeric_limits<float>::infinity();
    }
  const float rel = max_abs_diff(got, want).diff / max_ref;
  if (print) std::printf("[ gpu      ] %-56s rel err %.2e\n", label.c_str(), rel);
  return rel;
}

// Seconds per launch of `launch`, from CUDA events around a graph of n launches
// (host launch costs would otherwise hide microsecond kernels); best of 3.
inline double seconds_per_launch(const std::function<void()>& launch, int n = 50) {
  launch();  // first-use setup (occupancy queries, kernel attributes) outside the capture
  CudaGraph graph;
  graph.capture([&] {
    for (int i = 0; i < n; ++i) launch();
  });
  graph.replay();
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream());
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    cudaEventRecord(start, stream);
    graph.replay();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms * 1e-3 / n;
}

// A decode matvec's input range: ops::linear of w (CPU) on the GPU under
// `settings`, against the f32 product with w dequantized, within 1e-5, for three
// tokens of 1024 columns: one beyond f16's 65504, one below its normal range, one
// with each block of `block` columns at its own power of two; then a NaN in one
// of two tokens, which makes that token's outputs NaN and leaves the other alone.
inline void expect_huge_tiny_and_nan_inputs(const Weight& w, const ops::LaunchSettings& settings, int block,
                                            const std::string& name) {
  const int64_t in = w.cols(), out = w.rows();
  const Weight wg = w.to_device(Device::cuda);
  Tensor x = random({3, in}, DType::f32, 5);
  float* v = x.data<float>();
  for (int64_t i = 0; i < in; ++i) {
    v[i] *= 3e5f;                                              // token 0: beyond f16's 65504
    v[in + i] *= 1e-7f;                                        // token 1: below f16's normal range
    v[2 * in + i] *= float(1 << ((i / block) % 16)) * 1e-3f;  // token 2: each block at its own scale
  }
  const Tensor want = ops::linear(x, w.dequantize(DType::f32), Tensor());
  ops::set_launch_settings(settings);
  const Tensor got = ops::linear(x.to_device(Device::cuda), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({});
  for (int64_t t = 0; t < 3; ++t) {
    const std::string label = fmt::format("{} token {}", name, t);
    EXPECT_LE(relative_error(got.slice_rows(t, t + 1), want.slice_rows(t, t + 1), label), 1e-5f) << label;
  }
  Tensor nan_x = random({2, in}, DType::f32, 6);
  nan_x.data<float>()[in + 300] = std::nanf("");
  const Tensor finite = ops::linear(nan_x.slice_rows(0, 1), w.dequantize(DType::f32), Tensor());
  ops::set_launch_settings(settings);
  const Tensor nan_y = ops::linear(nan_x.to_device(Device::cuda), wg, Tensor()).to_device(Device::cpu);
  ops::set_launch_settings({});
  for (int64_t r = 0; r < out; ++r) EXPECT_TRUE(std::isnan(nan_y.data<float>()[out + r])) << name << " row " << r;
  EXPECT_LE(relative_error(nan_y.slice_rows(0, 1), finite, name + ", the finite token"), 1e-5f);
}

// Whether two tensors (any devices) hold the same shape, dtype and bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to_device(Device::cpu), y = b.to_device(Device::cpu);
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.raw(), y.raw(), x.size_bytes()) == 0;
}

// A decode position (i32 [1]) and a block table (i32 [blocks]) on the GPU.
inline Tensor device_position(int64_t p) {
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<int32_t>()[0] = int32_t(p);
  return gpu(t);
}
inline Tensor device_table(const std::vector<int32_t>& blocks) {
  Tensor t = Tensor::empty({int64_t(blocks.size())}, DType::i32);
  std::copy(blocks.begin(), blocks.end(), t.data<int32_t>());
  return gpu(t);
}

// B sequences of `rows` cache rows each on one pool of rows * B, block j (16
// rows) of sequence b at block j * B + b: their block tables (none for one
// sequence, whose rows are the pool's), and sequence b's first `keys` rows
// gathered from such a pool (f32, on the CPU).
inline ops::KvPages interleaved_pages(int64_t B, int64_t rows) {
  ops::KvPages pages;
  for (int64_t b = 0; b < B && B > 1; ++b) {
    std::vector<int32_t> blocks;
    for (int64_t j = 0; j < rows / 16; ++j) blocks.push_back(int32_t(j * B + b));
    pages.tables.push_back(device_table(blocks));
  }
  return pages;
}
inline Tensor sequence_rows(const Tensor& pool, int64_t B, int64_t b, int64_t keys) {
  const Tensor f32 = pool.to_device(Device::cpu).to(DType::f32);
  const int64_t row_floats = f32.numel() / f32.shape()[0];
  Shape shape = f32.shape();
  shape[0] = keys;
  Tensor out = Tensor::empty(shape, DType::f32);
  for (int64_t s = 0; s < keys; ++s) {
    const int64_t row = B == 1 ? s : (s / 16 * B + b) * 16 + s % 16;
    std::copy_n(f32.data<float>() + row * row_floats, row_floats, out.data<float>() + s * row_floats);
  }
  return out;
}

// The kernels `run` launches on the current stream, from a graph capture of one
// call (run it once before, so that the allocator has every size it needs).
struct KernelLaunch {
  std::string name;  // mangled
  dim3 grid, block;
};
inline std::vector<KernelLaunch> kernel_launches_by(const std::function<void()>& run) {
  auto stream = static_cast<cudaStream_t>(cuda_stream());
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  try {
    run();
  } catch (...) {  // end the capture, or every later test's stream work fails
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  std::vector<KernelLaunch> kernels;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    cudaGraphNodeGetType(node, &type);
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params{};
    if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
      cudaGetLastError();  // a library's kernel (cuBLAS): not the runtime's to name; clear the error
      kernels.push_back({"(library kernel)", dim3(), dim3()});
      continue;
    }
    const char* name = nullptr;
    cudaFuncGetName(&name, params.func);
    kernels.push_back({name ? name : "", params.gridDim, params.blockDim});
  }
  cudaGraphDestroy(graph);
  return kernels;
}
inline size_t kernels_launched_by(const std::function<void()>& run) { return kernel_launches_by(run).size(); }
// The first launch in a capture of `run` of a kernel whose name holds one of `names`.
inline KernelLaunch launch_named(const std::function<void()>& run, std::initializer_list<const char*> names) {
  for (const KernelLaunch& k : kernel_launches_by(run))
    for (const char* name : names)
      if (k.name.find(name) != std::string::npos) return k;
  ADD_FAILURE() << "no " << *names.begin() << " launched";
  return {};
}

// A fixture's 24 greedy decode steps after a 40-token prompt with `levers`, in a
// cache of `cache_rows`: the logits of each step (on the host), and the kernels
// one decode step launches.
struct FixtureDecode {
  std::vector<Tensor> logits;
  size_t step_kernels = 0;
  size_t merge_kernels = 0;  // of those, attention_merge_kernel launches
  int64_t layers = 0;
};
inline FixtureDecode decode_fixture(const std::string& family, const Levers& levers, int64_t cache_rows = 256) {
  FixtureDecode d;
  auto model = load_model(fixtures_dir() / family, Device::cuda, levers.load_options(Device::cuda));
  d.layers = model->kv_layout().n_layers;
  auto state = model->make_state(cache_rows);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(int32_t((31 * i + 7) % model->info().vocab));
  Tensor last = model->forward(prompt, *state, false);
  for (int step = 0; step < 24; ++step) {
    const Tensor host = last.to_device(Device::cpu);
    const float* row = host.data<float>() + (host.numel() - host.dim(-1));
    const int32_t next = int32_t(std::max_element(row, row + host.dim(-1)) - row);
    last = model->forward({next}, *state, false);
    d.logits.push_back(last.to_device(Device::cpu));
  }
  // One step's kernels, counted in a capture after a warm-up step (the allocator's sizes).
  Tensor ids = Tensor::empty({1}, DType::i32), pos = Tensor::empty({1}, DType::i32);
  ids.data<int32_t>()[0] = 3;
  state->reserve(state->length() + 1);
  pos.data<int32_t>()[0] = int32_t(state->length());
  const Tensor ids_dev = gpu(ids), pos_dev = gpu(pos);
  SeqState* states[] = {state.get()};
  model->run(ids_dev, pos_dev, states, false);
  device_synchronize();
  const std::vector<KernelLaunch> launches = kernel_launches_by([&] { model->run(ids_dev, pos_dev, states, false); });
  d.step_kernels = launches.size();
  for (const KernelLaunch& k : launches) d.merge_kernels += k.name.find("attention_merge_kernel") != std::string::npos;
  return d;
}

// Decode attention's shapes (heads over kv heads, head_dim, cache dtype) that
// the attention block forms' tests walk: the Llama-3-8B and Qwen3-30B-A3B
// groups, groups of 6 and 3 in larger blocks, head_dim 32, Qwen3-0.6B's groups
// of 2 and one head a kv head.
struct AttentionShape {
  int64_t heads, kv_heads, head_dim;
  DType cache;
};
inline const std::vector<AttentionShape>& attention_shapes() {
  static const std::vector<AttentionShape> shapes = {
      {32, 8, 128, DType::bf16},  // Llama-3-8B: groups of 4
      {32, 4, 128, DType::bf16},  // Qwen3-30B-A3B: groups of 8
      {12, 2, 64, DType::f16},    // a group of 6 in an 8-head block
      {6, 2, 64, DType::f32},     // a group of 3 in a 4-head block
      {16, 4, 32, DType::bf16},   // groups of 4, head_dim 32
      {16, 8, 128, DType::bf16},  // Qwen3-0.6B / 1.7B: groups of 2
      {8, 8, 64, DType::f16},     // one head a kv head (multi-head attention)
  };
  return shapes;
}

// One decode step of B sequences on one pool of `rows` cache rows each (their
// blocks interleaved), each seeing `keys` keys: the pool, q, the scale, and the
// CPU's output from each sequence's keys gathered from its blocks.
struct PagedAttentionStep {
  ops::KvPages pages;
  Tensor k_pool, v_pool, q, want;
  float scale = 0;
};
inline PagedAttentionStep paged_attention_step(const AttentionShape& c, int64_t B, int64_t rows, int64_t keys) {
  PagedAttentionStep s;
  s.pages = interleaved_pages(B, rows);
  s.k_pool = random({rows * B, c.kv_heads, c.head_dim}, DType::f32, 1).to(c.cache);
  s.v_pool = random({rows * B, c.kv_heads, c.head_dim}, DType::f32, 2).to(c.cache);
  s.q = random({B, c.heads, c.head_dim}, DType::f32, uint64_t(keys), 2.0f);
  s.scale = 1.0f / std::sqrt(float(c.head_dim));
  s.want = Tensor::empty({B, c.heads, c.head_dim}, DType::f32);
  for (int64_t b = 0; b < B; ++b) {
    const Tensor got = ops::attention(s.q.slice_rows(b, b + 1).clone(), sequence_rows(s.k_pool, B, b, keys),
                                      sequence_rows(s.v_pool, B, b, keys), keys - 1, s.scale);
    std::copy_n(got.data<float>(), got.numel(), s.want.data<float>() + b * c.heads * c.head_dim);
  }
  return s;
}

// The current GPU's SM count.
inline int sm_count() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// The wide attention form a decode step takes (lever wide_attention_blocks, as
// attention.cu's wide_form says): the fewest heads a block (1, 2, 4, up to the
// 4-warp form's 4 or 8) whose blocks, one an SM, fit a wave of the splits with
// keys; the grid's splits, the fewest (a power of two, 64 keys each) that hold
// the step's keys, up to the graph's `splits` or a wave; and the key counts
// that choose the same form. heads 0: the 4-warp form.
struct WideAttentionGrid {
  int64_t heads = 0, splits = 0, lo = 1, hi = INT64_MAX;
};
inline WideAttentionGrid wide_attention_grid(int64_t B, int64_t heads, int64_t kv_heads, int64_t keys,
                                             int64_t splits) {
  WideAttentionGrid w{0, splits};
  const int64_t group = heads / kv_heads, block = group <= 2 ? group : group <= 4 ? 4 : 8;
  for (int64_t hb = 1; hb <= block; hb *= 2) {
    const int64_t in_a_wave = sm_count() / (B * kv_heads * ((group + hb - 1) / hb)), most = in_a_wave * 64;
    const int64_t cap = std::min(splits, in_a_wave);
    int64_t grid = 1;
    while (grid < cap && grid * 64 < keys) grid *= 2;
    const int64_t from = std::max(w.lo, grid / 2 * 64 + 1);
    if (grid < cap) return {hb, grid, from, grid * 64};
    if (splits <= in_a_wave) return {hb, splits, from, INT64_MAX};  // at any key count past `from`
    if (keys <= most) return {hb, in_a_wave, from, most};
    w.lo = most + 1;
  }
  return w;
}

// Greedy batched decode through DecodeStep, graphed or eager: `batch`
// sequences of `prompt` tokens (each its own) on one block pool of `capacity`
// tokens a sequence, then `steps` steps; each step's tokens, and in `captures`
// the graphs the step captured.
inline std::vector<std::vector<int32_t>> decode_batch(const Model& model, int64_t batch, int64_t prompt, int64_t steps,
                                                      int64_t capacity, bool graphs, int64_t* captures = nullptr) {
  std::vector<std::unique_ptr<SeqState>> states;
  std::vector<SeqState*> raw;
  std::vector<Tensor> first_logits;
  auto pool = std::make_shared<BlockPool>(model.kv_layout(), batch * BlockPool::blocks_for_tokens(capacity));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < prompt; ++i) ids.push_back(int32_t((37 * b + 11 * i + 5) % model.info().vocab));
    states.push_back(std::make_unique<SeqState>(pool, capacity));
    raw.push_back(states.back().get());
    first_logits.push_back(model.forward(ids, *states.back(), false));
  }
  DeviceSampler sampler(SamplingParams{.temperature = 0}, model.info().vocab, batch);
  DecodeStep step(model, raw, sampler, graphs);
  std::vector<std::vector<int32_t>> tokens;
  int ticket = step.begin(ops::concat_rows(first_logits));
  for (int64_t s = 0; s < steps; ++s) {
    const auto got = step.wait_all(ticket);
    tokens.emplace_back(got.begin(), got.end());
    ticket = step.queue();
  }
  if (captures) *captures = step.captures();
  EXPECT_EQ(step.length(), prompt + steps);
  return tokens;
}

}  // namespace mere::test
