// DeviceSampler: the Tensor-facing side of device_sampler.cu. A build without
// the CUDA backend gets stubs that say so.
#include "sampling/device_sampler.h"

#include "core/tensor.h"

#ifdef MERE_HAVE_CUDA

#include "core/cuda_check.h"

namespace mere {

namespace {
// The state: the rows' draw counters, then their presence flags.
size_t present_offset(int64_t rows) { return sizeof(uint64_t) * size_t(rows); }
}  // namespace

DeviceSampler::DeviceSampler(const SamplingParams& params, int64_t vocab, int64_t rows)
    : params_(params), vocab_(vocab), rows_(rows) {
  params.check();
  MERE_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "DeviceSampler: vocab {} out of range", vocab);
  MERE_CHECK(rows >= 1 && rows <= 65535, "DeviceSampler: {} rows; 1 to 65535 fit one launch", rows);
  MERE_CUDA(cuda::prepare_sample_kernel(vocab, &per_thread_));
  MERE_CHECK(per_thread_ > 0, "DeviceSampler: vocab {} does not fit the sampling kernel's shared memory", vocab);
  const size_t bytes = present_offset(rows) + size_t(rows * vocab);
  state_ = device_alloc(bytes);
  zero_bytes(state_, Device::cuda, bytes);
}

DeviceSampler::~DeviceSampler() { device_free(state_); }

void DeviceSampler::reset(const std::vector<int32_t>& context) {
  reset(std::vector<std::vector<int32_t>>(size_t(rows_), context));
}

void DeviceSampler::reset(const std::vector<std::vector<int32_t>>& contexts) {
  MERE_CHECK(int64_t(contexts.size()) == rows_, "DeviceSampler::reset: {} contexts for {} rows", contexts.size(),
             rows_);
  const size_t offset = present_offset(rows_);
  std::vector<uint8_t> state(offset + size_t(rows_ * vocab_), 0);  // draws = 0
  for (size_t r = 0; r < contexts.size(); ++r)
    for (int32_t id : contexts[r])
      if (id >= 0 && id < vocab_) state[offset + r * size_t(vocab_) + size_t(id)] = 1;
  copy_bytes(state_, Device::cuda, state.data(), Device::cpu, state.size());
}

void DeviceSampler::sample(const Tensor& logits, int32_t* out_ids) {
  MERE_CHECK(logits.device() == Device::cuda && logits.dtype() == DType::f32,
             "DeviceSampler::sample: logits must be f32 on the GPU, got {} on {}", dtype_name(logits.dtype()),
             logits.device() == Device::cuda ? "cuda" : "cpu");
  const bool one_row = rows_ == 1 && logits.rank() == 1;
  MERE_CHECK(logits.numel() == rows_ * vocab_ && (one_row || (logits.rank() == 2 && logits.dim(0) == rows_)),
             "DeviceSampler::sample: logits have shape {}, expected [{}, {}]{}", shape_str(logits.shape()), rows_,
             vocab_, rows_ == 1 ? fmt::format(" or [{}]", vocab_) : "");
  cuda::SampleArgs args{};
  args.logits = logits.data<float>();
  args.vocab = vocab_;
  args.rows = rows_;
  args.per_thread = per_thread_;
  args.draws = static_cast<uint64_t*>(state_);
  args.present = static_cast<uint8_t*>(state_) + present_offset(rows_);
  args.out_id = out_ids;
  args.params = params_;
  MERE_CUDA(cuda::launch_sample(args, static_cast<cudaStream_t>(cuda_stream())));
}

int64_t DeviceSampler::draws(int64_t row) const {
  MERE_CHECK(row >= 0 && row < rows_, "DeviceSampler::draws: row {} of {}", row, rows_);
  uint64_t n = 0;
  copy_bytes(&n, Device::cpu, static_cast<const uint64_t*>(state_) + row, Device::cuda, sizeof(n));
  return int64_t(n);
}

}  // namespace mere

#else

namespace mere {

DeviceSampler::DeviceSampler(const SamplingParams& params, int64_t vocab, int64_t rows)
    : params_(params), vocab_(vocab), rows_(rows) {
  fail("DeviceSampler needs the CUDA backend; this binary was built without it");
}
DeviceSampler::~DeviceSampler() = default;
void DeviceSampler::reset(const std::vector<int32_t>&) { fail("DeviceSampler needs the CUDA backend"); }
void DeviceSampler::reset(const std::vector<std::vector<int32_t>>&) { fail("DeviceSampler needs the CUDA backend"); }
void DeviceSampler::sample(const Tensor&, int32_t*) { fail("DeviceSampler needs the CUDA backend"); }
int64_t DeviceSampler::draws(int64_t) const { fail("DeviceSampler needs the CUDA backend"); }

}  // namespace mere

#endif
