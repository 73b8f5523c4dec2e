#!/usr/bin/env python3
"""MLX-format affine-quantized fixtures for mere's tests, made with an independent
numpy quantizer and Hugging Face transformers.

Run on the GPU machine (any machine with numpy, torch, transformers and safetensors):
    python3 scripts/make_quant_fixtures.py --fixtures tests/fixtures --out DIR
For each case in CASES it reads the dense fixture tests/fixtures/<source> (made by
scripts/make_fixtures.py), quantizes every 2-D `<module>.weight` whose input dimension
divides by the group size, and writes <name>/ into DIR/quant_fixtures.tar:
  config.json           the source's, plus "quantization" and "quantization_config"
                        = {"group_size": g, "bits": b}, as mlx-lm writes them, with an
                        entry {"group_size": g', "bits": b'} for each module the case
                        quantizes otherwise (mlx-lm's per-module overrides)
  model.safetensors     `<module>.weight` packed u32, `<module>.scales`, `<module>.biases`
                        in the model dtype; every other tensor unchanged
  generation_config.json
  logits.npy, reference.json
                        transformers' float32 CPU logits of the source fixture's ids with
                        every quantized weight replaced by its dequantization
                        (scales * q + biases, in float32), and a 32-token greedy
                        continuation, in the format of the dense fixtures.
Extract into tests/fixtures/. No tokenizer: the tests work on ids.

The quantizer is MLX's affine mode ("affine" in mx.quantize's documentation: per group
of g consecutive weights of a row, w ~ scale * q + bias with q in [0, 2^bits - 1]), with
the rounding of the kernel mx.quantize runs on Apple GPUs, where mlx-lm converts models.
It is written here in numpy, vectorized over whole matrices, so that mere's C++
quantizer (src/quant/affine_quantize.cpp) is checked against a second implementation.
"""
import argparse
import json
import os
import shutil
import tarfile
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

GREEDY_TOKENS = 32

# name: (source fixture, bits, group size, {module: (bits, group size)} overrides)
CASES = {
    "qwen3-mlx4": ("qwen3", 4, 32, {}),   # f32 weights: f32 scales and biases
    "llama-mlx8": ("llama", 8, 32, {}),   # bf16 weights: bf16 scales and biases
    # f16 weights, q/k/v biases, and tied embeddings: the quantized embedding is
    # also lm_head, here at 8 bits in groups of 32 while the rest is int4 g64.
    "qwen2-mlx4": ("qwen2", 4, 64, {"model.embed_tokens": (8, 32)}),
}

F32 = np.float32


def round_half_away(x):
    """Round a float32 array to integers, halves away from zero (Metal's round()).
    Done in float64, where |x| + 0.5 is exact for every float32 x, then back."""
    x64 = x.astype(np.float64)
    return (np.sign(x64) * np.floor(np.abs(x64) + 0.5)).astype(F32)


def affine_quantize(w, bits, group_size):
    """w: float32 [out, in]. Returns the codes (uint32 [out, in]) and the float32
    scales and biases [out, in / group_size], before rounding to the model dtype.

    Per group: lo = min(w); hi = max(w, 0) (the kernel's running maximum starts at 0);
    the scale spans [lo, hi] in 2^bits - 1 steps (at least 1e-7), signed so that the
    larger-magnitude edge maps to a code q0 = round(edge / scale); when q0 != 0 the scale
    is re-derived as edge / q0 and the bias is the edge, so the edge and zero are exact
    codes; otherwise the bias is 0. Codes: round((w - bias) / scale), at most 2^bits - 1.
    All arithmetic in float32."""
    n_bins = F32(2 ** bits - 1)
    rows, cols = w.shape
    g = w.astype(F32).reshape(rows, cols // group_size, group_size)
    lo = g.min(axis=-1)
    hi = np.maximum(g.max(axis=-1), F32(0))
    low_edge = np.abs(lo) > np.abs(hi)
    scale = np.maximum((hi - lo) / n_bins, F32(1e-7))
    scale = np.where(low_edge, scale, -scale)
    edge = np.where(low_edge, lo, hi)
    q0 = round_half_away(edge / scale)
    nonzero = q0 != 0
    scale = np.where(nonzero, edge / np.where(nonzero, q0, F32(1)), scale).astype(F32)
    bias = np.where(nonzero, edge, F32(0)).astype(F32)
    q = round_half_away((g - bias[..., None]) / scale[..., None])
    q = np.minimum(np.maximum(q, F32(0)), n_bins).astype(np.uint32)
    return q.reshape(rows, cols), scale, bias


def pack(codes, bits):
    """32 / bits codes per uint32 word, the first in the lowest bits."""
    per_word = 32 // bits
    rows, cols = codes.shape
    c = codes.reshape(rows, cols // per_word, per_word).astype(np.uint32)
    shifts = (np.arange(per_word, dtype=np.uint32) * np.uint32(bits))
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)


def unpack(packed, bits, cols):
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * np.uint32(bits))
    c = (packed[..., None] >> shifts) & np.uint32(2 ** bits - 1)
    return c.reshape(packed.shape[0], cols)


def as_torch_u32(a):
    try:
        t = torch.from_numpy(a)
        if t.dtype == torch.uint32:
            return t
    except TypeError:
        pass
    return torch.from_numpy(a.view(np.int32)).view(torch.uint32)


def to_dtype(x, dtype):
    """float32 numpy -> torch tensor of the model dtype (round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype)


def make_case(name, source, bits, group_size, overrides, fixtures, root):
    src = os.path.join(fixtures, source)
    path = os.path.join(root, name)
    os.makedirs(path)
    with open(os.path.join(src, "reference.json")) as f:
        src_ref = json.load(f)

    tensors, dequantized, quantized = {}, {}, []
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as f:
        for key in sorted(f.keys()):
            t = f.get_tensor(key)
            module = key[: -len(".weight")] if key.endswith(".weight") else key
            m_bits, m_group = overrides.get(module, (bits, group_size))
            if not (key.endswith(".weight") and t.dim() == 2 and t.shape[1] % m_group == 0):
                tensors[key] = t
                continue
            w = t.float().numpy()
            codes, scale, bias = affine_quantize(w, m_bits, m_group)
            packed = pack(codes, m_bits)
            assert np.array_equal(unpack(packed, m_bits, w.shape[1]), codes)
            scales, biases = to_dtype(scale, t.dtype), to_dtype(bias, t.dtype)
            tensors[key] = as_torch_u32(packed)
            tensors[module + ".scales"] = scales
            tensors[module + ".biases"] = biases
            s = scales.float().numpy().repeat(m_group, axis=1)
            b = biases.float().numpy().repeat(m_group, axis=1)
            deq = (s * codes.astype(F32) + b).astype(F32)
            # Each weight lies within half a step of its code (a whole step at the top code:
            # pinning the edge to a code can shorten the span), plus what rounding the
            # scale and bias to the model dtype moved it.
            slack = np.abs(scale - scales.float().numpy()) * F32(2 ** m_bits - 1) + np.abs(bias - biases.float().numpy())
            steps = np.where(codes == 2 ** m_bits - 1, 1.0, 0.5)
            bound = np.abs(scale).repeat(m_group, axis=1) * steps + slack.repeat(m_group, axis=1) + 1e-6
            assert np.all(np.abs(deq - w) <= bound), f"{name}: {key} round trip off"
            dequantized[key] = torch.from_numpy(deq)
            quantized.append(module)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "mlx"})
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        for module in quantized:
            assert f.get_tensor(module + ".weight").dtype == torch.uint32, module

    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    assert set(overrides) <= set(quantized), f"{name}: an override names no quantized module"
    q = {"group_size": group_size, "bits": bits}
    q.update({m: {"group_size": g, "bits": b} for m, (b, g) in overrides.items()})
    config["quantization"] = q
    config["quantization_config"] = dict(q)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), path)

    # The reference: the source model in float32 with the dequantized weights, on the CPU.
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    params = dict(model.named_parameters())  # a tied lm_head is embed_tokens' parameter
    with torch.no_grad():
        for key, deq in dequantized.items():
            assert params[key].shape == deq.shape, key
            params[key].copy_(deq)
    if config.get("tie_word_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), f"{name}: lm_head not tied"
    ids = torch.tensor([src_ref["ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        seq = ids.clone()
        for _ in range(GREEDY_TOKENS):
            nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    np.save(os.path.join(path, "logits.npy"), logits.astype(np.float32))
    greedy = seq[0, ids.shape[1]:].tolist()
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump({"family": src_ref["family"], "source": source, "bits": bits, "group_size": group_size,
                   "overrides": {m: {"bits": b, "group_size": g} for m, (b, g) in overrides.items()},
                   "weights_dtype": src_ref["weights_dtype"], "quantized_modules": len(quantized),
                   "quantizer": "numpy, scripts/make_quant_fixtures.py",
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "numpy": np.__version__, "ids": src_ref["ids"], "greedy": greedy, "logits": "logits.npy",
                   "max_abs_logit": float(np.abs(logits).max())}, f, indent=2)
    dense_logits = np.load(os.path.join(src, "logits.npy"))
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {len(quantized)} matrices int{bits} g{group_size}, {size / 1e3:.0f} kB, "
          f"max |logit| {np.abs(logits).max():.3f}, max |logit - dense| {np.abs(logits - dense_logits).max():.4f}, "
          f"greedy {greedy[:8]}..., dense greedy {src_ref['greedy'][:8]}...")
    assert size < 1e6, f"{name} fixture is {size} bytes"


def self_test():
    """Hand-checked groups: the packing order and the edge rule."""
    w = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5] * 4], dtype=F32)  # one group of 32
    codes, scale, bias = affine_quantize(w, 4, 32)
    # lo 0, hi 7.5: |lo| <= |hi|, scale = -0.5, edge 7.5, q0 = -15, bias 7.5
    assert scale[0, 0] == F32(-0.5) and bias[0, 0] == F32(7.5), (scale, bias)
    assert codes[0, :8].tolist() == [15, 13, 11, 9, 7, 5, 3, 0], codes[0, :8]
    assert pack(codes, 4)[0, 0] == 0x0357_9BDF, hex(pack(codes, 4)[0, 0])
    assert round_half_away(np.array([0.5, -0.5, 1.5, 2.5, -2.5], dtype=F32)).tolist() == [1, -1, 2, 3, -3]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixtures", default="tests/fixtures")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    self_test()
    root = tempfile.mkdtemp()
    for name, (source, bits, group_size, overrides) in CASES.items():
        make_case(name, source, bits, group_size, overrides, args.fixtures, root)
    os.makedirs(args.out, exist_ok=True)
    with tarfile.open(os.path.join(args.out, "quant_fixtures.tar"), "w") as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(os.path.join(root, entry), arcname=entry)
    print("wrote", os.path.join(args.out, "quant_fixtures.tar"))


if __name__ == "__main__":
    main()
