// Issue 6's kernel target on whole layers (ctest label gpu): the decode
// matvecs of a Llama-3-8B step, each with the prepare kernel that forms its
// input as the decode step does, timed back to back, against this GPU's own
// measured copy bandwidth. A benchmark: nothing is asserted but that it runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/device.h"
#include "engine/bench.h"
#include "engine/levers.h"
#include "models/model.h"
#include "ops/cuda/affine_launchers.h"
#include "ops/ops.h"
#include "gpu_test_util.h"

namespace mere {
namespace {

class AffineStep : public test::NeedsGpuDefaultLaunch {};

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

// 32 layers of distinct random weights (q/k/v, o, gate/up, down), then lm_head;
// groups of 64, bf16 scales; T tokens under the decode defaults (three digits
// of x at one token, two from two). The inputs are the step's: RMSNorm(h) for
// q/k/v, gate/up and lm_head, silu(gate) up for down; o's is a plain row (the
// step merges attention's splits into it, which reads a little more). o and
// down add into h. Bytes: the packed weights, scales and biases.
TEST_F(AffineStep, TimingOnLlama3Layers) {
  apply_launch_settings(Levers{}.load_options(Device::cuda), Device::cuda);  // the decode defaults
  const Ceilings ceilings = calibrate(Device::cuda);
  std::printf("[ timing   ] this GPU's copy bandwidth: %.3f TB/s\n", ceilings.copy_bytes_per_s / 1e12);
  constexpr int64_t kD = 4096, kFf = 14336, kLayers = 32, kVocab = 128256, kMaxT = 8;
  auto digits_for = [](int64_t T) { return T == 1 ? 3 : 2; };  // the decode default (int16_activation_matvec)
  for (int bits : {4, 8}) {
    struct Matrix {
      Tensor packed, scales, biases;
      cuda::AffineArgs a;
    };
    double bytes = 0;
    auto matrix = [&](int64_t out, int64_t in, uint64_t seed) {
      Matrix m;
      m.packed = Tensor::empty({out, in * bits / 32}, DType::u32, Device::cuda);
      EXPECT_EQ(cuda::launch_fill_random_bytes(m.packed.raw(), int64_t(m.packed.size_bytes()), seed, 0xff, stream()),
                cudaSuccess);
      m.scales = Tensor::empty({out, in / 64}, DType::bf16, Device::cuda);
      m.biases = Tensor::empty({out, in / 64}, DType::bf16, Device::cuda);
      ops::fill_random(m.scales, seed + 1, 0.005f, 0.01f);
      ops::fill_random(m.biases, seed + 2, 0.01f, -0.01f * float(1 << (bits - 1)));
      m.a = {static_cast<const uint32_t*>(m.packed.raw()), m.scales.raw(), m.biases.raw(), DType::bf16, bits, 64, in,
             out};
      bytes += double(m.packed.size_bytes() + m.scales.size_bytes() + m.biases.size_bytes());
      return m;
    };
    std::vector<Matrix> layers;
    for (int64_t l = 0; l < kLayers; ++l) {
      layers.push_back(matrix(6144, kD, 100 * l + 1));
      layers.push_back(matrix(kD, kD, 100 * l + 2));
      layers.push_back(matrix(2 * kFf, kD, 100 * l + 3));
      layers.push_back(matrix(kD, kFf, 100 * l + 4));
    }
    const Matrix lm_head = matrix(kVocab, kD, 7);
    Tensor h = Tensor::empty({kMaxT, kD}, DType::f32, Device::cuda);
    Tensor attn = Tensor::empty({kMaxT, kD}, DType::f32, Device::cuda);
    Tensor norm_w = Tensor::empty({kD}, DType::bf16, Device::cuda);
    Tensor qkv = Tensor::empty({kMaxT, 6144}, DType::f32, Device::cuda);
    Tensor gate_up = Tensor::empty({kMaxT, 2 * kFf}, DType::f32, Device::cuda);
    Tensor logits = Tensor::empty({kMaxT, kVocab}, DType::f32, Device::cuda);
    ops::fill_random(h, 1, 1.0f);
    ops::fill_random(attn, 2, 1.0f);
    ops::fill_random(norm_w, 3, 0.1f, 1.0f);
    ops::fill_random(gate_up, 4, 1.0f);
    int64_t scratch_bytes = 0;  // the launches share it, one after another on the stream
    const Matrix* kinds[] = {&layers[0], &layers[1], &layers[2], &layers[3], &lm_head};
    for (const Matrix* m : kinds)
      for (int64_t T : {int64_t(1), kMaxT})
        scratch_bytes = std::max(scratch_bytes, cuda::affine_matvec_mma_scratch_bytes(m->a, T, digits_for(T)));
    Tensor scratch = Tensor::empty({scratch_bytes}, DType::u8, Device::cuda);
    for (int64_t T : {1, 2, 4, 8}) {
      const int digits = digits_for(T);
      using Kind = cuda::AffineMmaInput::Kind;
      const cuda::AffineMmaInput normed{.kind = Kind::rms_normed, .x = h.data<float>(), .norm_w = norm_w.raw(),
                                        .norm_dtype = DType::bf16, .eps = 1e-5f, .digits = digits};
      const cuda::AffineMmaInput plain{.x = attn.data<float>(), .digits = digits};
      const cuda::AffineMmaInput gated{.kind = Kind::silu_gated, .x = gate_up.data<float>(), .digits = digits};
      bool ok = true;
      auto run = [&](const Matrix& m, const cuda::AffineMmaInput& input, float* y, bool adds) {
        ok = ok &&
             cuda::launch_affine_matvec_mma(m.a, input, nullptr, y, T, scratch.raw(), stream(), adds) == cudaSuccess;
      };
      const double s = test::seconds_per_launch(
          [&] {
            for (int64_t l = 0; l < kLayers; ++l) {
              run(layers[4 * l], normed, qkv.data<float>(), false);
              run(layers[4 * l + 1], plain, h.data<float>(), true);
              run(layers[4 * l + 2], normed, gate_up.data<float>(), false);
              run(layers[4 * l + 3], gated, h.data<float>(), true);
            }
            run(lm_head, normed, logits.data<float>(), false);
          },
          3);
      EXPECT_TRUE(ok) << "int" << bits << " T=" << T;
      std::printf("[ timing   ] int%d g64 T=%lld: %8.1f us a step, %6.0f GB/s, %5.3f of this GPU's copy bandwidth\n",
                  bits, static_cast<long long>(T), s * 1e6, bytes / s / 1e9, bytes / s / ceilings.copy_bytes_per_s);
    }
  }
}

}  // namespace
}  // namespace mere
