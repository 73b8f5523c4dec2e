#include "ops/weight.h"

#include <cmath>

#include <fmt/format.h>

#include "ops/ops.h"

namespace mere {
namespace {

Tensor on_cpu(const Tensor& t) { return t.to_device(Device::cpu); }

}  // namespace

Weight::Weight(Tensor dense) {
  if (!dense.defined()) return;
  MERE_CHECK(dense.rank() == 2, "a dense weight must be 2-D, got {}", shape_str(dense.shape()));
  rows_ = dense.dim(0);
  cols_ = dense.dim(1);
  storage_ = std::move(dense);
}

Weight::Weight(AffineWeight a, int64_t in) {
  MERE_CHECK(a.bits == 4 || a.bits == 8, "affine weight: {} bits (4 or 8 are supported)", a.bits);
  MERE_CHECK(a.group_size > 0 && in % a.group_size == 0, "affine weight: group size {} does not divide {} columns",
             a.group_size, in);
  const int64_t out = a.packed.dim(0);
  MERE_CHECK(a.packed.dtype() == DType::u32 && a.packed.shape() == Shape({out, in * a.bits / 32}),
             "affine weight: packed is {} {}, expected u32 [{}, {}]", dtype_name(a.packed.dtype()),
             shape_str(a.packed.shape()), out, in * a.bits / 32);
  const Shape groups{out, in / a.group_size};
  MERE_CHECK(a.scales.shape() == groups && a.biases.shape() == groups,
             "affine weight: scales {} and biases {} must be {}", shape_str(a.scales.shape()),
             shape_str(a.biases.shape()), shape_str(groups));
  rows_ = out;
  cols_ = in;
  storage_ = std::move(a);
}

Weight::Weight(Fp8Weight f) {
  MERE_CHECK(f.values.dtype() == DType::f8_e4m3 && f.values.rank() == 2,
             "fp8 weight: values must be f8_e4m3 [out, in], got {} {}",
             dtype_name(f.values.dtype()), shape_str(f.values.shape()));
  rows_ = f.values.dim(0);
  cols_ = f.values.dim(1);
  const Shape blocks{(rows_ + f.block - 1) / f.block, (cols_ + f.block - 1) / f.block};
  MERE_CHECK(f.scale_inv.dtype() == DType::f32 && f.scale_inv.shape() == blocks,
             "fp8 weight: scale_inv is {} {}, expected f32 {}", dtype_name(f.scale_inv.dtype()),
             shape_str(f.scale_inv.shape()), shape_str(blocks));
  storage_ = std::move(f);
}

Weight::Kind Weight::kind() const { return Kind(storage_.index()); }

const Tensor& Weight::dense() const {
  MERE_CHECK(kind() == Kind::dense, "expected a dense weight, got {}", describe());
  return std::get<Tensor>(storage_);
}
const AffineWeight& Weight::affine() const {
  MERE_CHECK(kind() == Kind::affine, "expected an affine-quantized weight, got {}", describe());
  return std::get<AffineWeight>(storage_);
}
const Fp8Weight& Weight::fp8() const {
  MERE_CHECK(kind() == Kind::fp8, "expected an fp8 weight, got {}", describe());
  return std::get<Fp8Weight>(storage_);
}

Device Weight::device() const {
  switch (kind()) {
    case Kind::dense: return dense().device();
    case Kind::affine: return affine().packed.device();
    case Kind::fp8: return fp8().values.device();
    default: return Device::cpu;
  }
}

uint64_t Weight::size_bytes() const {
  switch (kind()) {
    case Kind::dense: return dense().size_bytes();
    case Kind::affine: return affine().packed.size_bytes() + affine().scales.size_bytes() + affine().biases.size_bytes();
    case Kind::fp8: return fp8().values.size_bytes() + fp8().scale_inv.size_bytes();
    default: return 0;
  }
}

std::string Weight::describe() const {
  switch (kind()) {
    case Kind::dense: return std::string(dtype_name(dense().dtype()));
    case Kind::affine: return fmt::format("affine int{} g{}", affine().bits, affine().group_size);
    case Kind::fp8: return fmt::format("fp8 e4m3 {}x{}", fp8().block, fp8().block);
    default: return "none";
  }
}

Weight Weight::to_device(Device device) const {
  switch (kind()) {
    case Kind::dense: return Weight(dense().to_device(device));
    case Kind::affine: {
      AffineWeight a = affine();
      a.packed = a.packed.to_device(device);
      a.scales = a.scales.to_device(device);
      a.biases = a.biases.to_device(device);
      return Weight(std::move(a), cols_);
    }
    case Kind::fp8: {
      Fp8Weight f = fp8();
      f.values = f.values.to_device(device);
      f.scale_inv = f.scale_inv.to_device(device);
      return Weight(std::move(f));
    }
    default: return *this;
  }
}

Tensor Weight::dequantize(DType dtype) const {
  if (kind() == Kind::dense) {
    Tensor d = dense();
    if (d.dtype() == dtype) return d;
    Tensor out = Tensor::empty(d.shape(), dtype, d.device());
    ops::convert_into(d, out);
    return out;
  }
  // The reference: plain loops on the host, then back to the weight's device.
  Tensor w = Tensor::empty({rows_, cols_}, DType::f32);
  float* dst = w.data<float>();
  if (kind() == Kind::affine) {
    const AffineWeight& a = affine();
    Tensor packed = on_cpu(a.packed);
    std::vector<float> scales = on_cpu(a.scales).to_floats(), biases = on_cpu(a.biases).to_floats();
    const int per_word = 32 / a.bits;
    const uint32_t mask = (1u << a.bits) - 1;
    const int64_t words = cols_ / per_word, groups = cols_ / a.group_size;
    for (int64_t o = 0; o < rows_; ++o)
      for (int64_t i = 0; i < cols_; ++i) {
        const uint32_t word = packed.data<uint32_t>()[o * words + i / per_word];
        const uint32_t q = (word >> ((i % per_word) * a.bits)) & mask;
        const size_t g = size_t(o * groups + i / a.group_size);
        dst[o * cols_ + i] = scales[g] * float(q) + biases[g];
      }
  } else {
    const Fp8Weight& f = fp8();
    Tensor values = on_cpu(f.values), scale_inv = on_cpu(f.scale_inv);
    const int64_t block_cols = scale_inv.dim(1);
    for (int64_t o = 0; o < rows_; ++o)
      for (int64_t i = 0; i < cols_; ++i)
        dst[o * cols_ + i] = f8_e4m3_to_f32(values.data<uint8_t>()[o * cols_ + i]) *
                             scale_inv.data<float>()[(o / f.block) * block_cols + i / f.block];
  }
  Tensor out = dtype == DType::f32 ? w : w.to(dtype);
  return out.to_device(device());
}

Weight Weight::slice_rows(int64_t begin, int64_t end) const {
  MERE_CHECK(0 <= begin && begin <= end && end <= rows_, "Weight::slice_rows: rows [{}, {}) of {}", begin, end, rows_);
  switch (kind()) {
    case Kind::dense: return Weight(dense().slice_rows(begin, end));
    case Kind::affine: {
      AffineWeight a = affine();
      a.packed = a.packed.slice_rows(begin, end);
      a.scales = a.scales.slice_rows(begin, end);
      a.biases = a.biases.slice_rows(begin, end);
      return Weight(std::move(a), cols_);
    }
    case Kind::fp8: {
      const Fp8Weight& f = fp8();
      MERE_CHECK(begin % f.block == 0, "Weight::slice_rows: fp8 rows from {} do not start a {}-row scale block", begin,
                 f.block);
      return Weight(Fp8Weight{f.values.slice_rows(begin, end),
                              f.scale_inv.slice_rows(begin / f.block, (end + f.block - 1) / f.block), f.block});
    }
    case Kind::none: break;
  }
  fail("Weight::slice_rows: the weight is not set");
}

Weight Weight::concat_rows(const std::vector<Weight>& parts, std::optional<Device> device) {
  MERE_CHECK(!parts.empty(), "Weight::concat_rows: nothing to stack");
  const Kind k = parts[0].kind();
  for (const Weight& p : parts)
    if (p.kind() != k || p.cols() != parts[0].cols()) return Weight();
  if (k == Kind::dense) {
    std::vector<Tensor> dense;
    for (const Weight& p : parts) {
      if (p.dense().dtype() != parts[0].dense().dtype()) return Weight();
      dense.push_back(p.dense());
    }
    return Weight(ops::concat_rows(dense, device));
  }
  if (k == Kind::affine) {
    const AffineWeight& first = parts[0].affine();
    std::vector<Tensor> packed, scales, biases;
    for (const Weight& p : parts) {
      const AffineWeight& a = p.affine();
      if (a.bits != first.bits || a.group_size != first.group_size || a.scales.dtype() != first.scales.dtype() ||
          a.biases.dtype() != first.biases.dtype())
        return Weight();
      packed.push_back(a.packed);
      scales.push_back(a.scales);
      biases.push_back(a.biases);
    }
    AffineWeight fused{ops::concat_rows(packed, device), ops::concat_rows(scales, device),
                       ops::concat_rows(biases, device), first.bits,
                       first.group_size};
    return Weight(std::move(fused), parts[0].cols());
  }
  // fp8: the block rows of scales stack only when no block straddles a seam
  // (every part but the last a whole number of blocks); otherwise keep them apart.
  const Fp8Weight& first = parts[0].fp8();
  std::vector<Tensor> values, scales;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Fp8Weight& f = parts[i].fp8();
    if (f.block != first.block || (i + 1 < parts.size() && parts[i].rows() % f.block != 0)) return Weight();
    values.push_back(f.values);
    scales.push_back(f.scale_inv);
  }
  return Weight(Fp8Weight{ops::concat_rows(values, device), ops::concat_rows(scales, device), first.block});
}

}  // namespace mere
