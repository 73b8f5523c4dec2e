// DeviceSampler: the Tensor-facing side of device_sampler.cu. A build without
// the CUDA backend gets stubs that say so.
#include "sampling/device_sampler.h"

#include "core/tensor.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"

namespace mere {

namespace {
constexpr size_t kPresentOffset = sizeof(uint64_t);  // state: the draw counter, then the presence flags
}

DeviceSampler::DeviceSampler(const SamplingParams& params, int64_t vocab) : params_(params), vocab_(vocab) {
  MERE_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "DeviceSampler: vocab {} out of range", vocab);
  MERE_CUDA(cuda::prepare_sample_kernel(vocab, &per_thread_));
  MERE_CHECK(per_thread_ > 0, "DeviceSampler: vocab {} does not fit the sampling kernel's shared memory", vocab);
  state_ = device_alloc(kPresentOffset + size_t(vocab));
  zero_bytes(state_, Device::cuda, kPresentOffset + size_t(vocab));
}

DeviceSampler::~DeviceSampler() { device_free(state_); }

void DeviceSampler::reset(const std::vector<int32_t>& context) {
  std::vector<uint8_t> state(kPresentOffset + size_t(vocab_), 0);  // draws = 0
  for (int32_t id : context)
    if (id >= 0 && id < vocab_) state[kPresentOffset + size_t(id)] = 1;
  copy_bytes(state_, Device::cuda, state.data(), Device::cpu, state.size());
}

void DeviceSampler::sample(const Tensor& logits, int32_t* out_id) {
  MERE_CHECK(logits.device() == Device::cuda && logits.dtype() == DType::f32,
             "DeviceSampler::sample: logits must be f32 on the GPU, got {} on {}", dtype_name(logits.dtype()),
             logits.device() == Device::cuda ? "cuda" : "cpu");
  MERE_CHECK(logits.numel() == vocab_ && (logits.rank() == 1 || (logits.rank() == 2 && logits.dim(0) == 1)),
             "DeviceSampler::sample: logits have shape {}, expected [1, {}] or [{}]", shape_str(logits.shape()),
             vocab_, vocab_);
  cuda::SampleArgs args{};
  args.logits = logits.data<float>();
  args.vocab = vocab_;
  args.per_thread = per_thread_;
  args.draws = static_cast<uint64_t*>(state_);
  args.present = static_cast<uint8_t*>(state_) + kPresentOffset;
  args.out_id = out_id;
  args.params = params_;
  MERE_CUDA(cuda::launch_sample(args, static_cast<cudaStream_t>(cuda_stream())));
}

int64_t DeviceSampler::draws() const {
  uint64_t n = 0;
  copy_bytes(&n, Device::cpu, state_, Device::cuda, sizeof(n));
  return int64_t(n);
}

}  // namespace mere

#else

namespace mere {

DeviceSampler::DeviceSampler(const SamplingParams& params, int64_t vocab) : params_(params), vocab_(vocab) {
  fail("DeviceSampler needs the CUDA backend; this binary was built without it");
}
DeviceSampler::~DeviceSampler() = default;
void DeviceSampler::reset(const std::vector<int32_t>&) { fail("DeviceSampler needs the CUDA backend"); }
void DeviceSampler::sample(const Tensor&, int32_t*) { fail("DeviceSampler needs the CUDA backend"); }
int64_t DeviceSampler::draws() const { fail("DeviceSampler needs the CUDA backend"); }

}  // namespace mere

#endif
