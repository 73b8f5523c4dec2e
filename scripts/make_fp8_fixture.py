#!/usr/bin/env python3
"""The FP8 fixture: tests/fixtures/qwen3 with its linear weights (and lm_head) in
FP8 E4M3 with 128x128 block scales, as DeepSeek-V3 and Qwen3 FP8 checkpoints store
them (`<module>.weight` float8_e4m3fn, `<module>.weight_scale_inv` with
w = weight * scale_inv per block; quantization_config quant_method "fp8"), and the
float32 logits transformers gives for the dequantized model on the fixture's ids.

Run where torch + transformers are (the GPU machine; the CPU is enough):
    python3 scripts/make_fp8_fixture.py --src tests/fixtures/qwen3 --out DIR
Writes DIR/{config.json, model.safetensors, reference.json, logits.npy}; copy
them and the tokenizer files of the source into tests/fixtures/qwen3-fp8/.
Scales are f32 except in layer 1, where they are bf16 (both occur in the wild).
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

BLOCK = 128
E4M3_MAX = 448.0


def quantize(w, scale_dtype):
    """w [out, in] f32 -> (values float8_e4m3fn [out, in], scale_inv [ceil(out/128), ceil(in/128)])."""
    out, inn = w.shape
    rb, cb = -(-out // BLOCK), -(-inn // BLOCK)
    padded = torch.zeros(rb * BLOCK, cb * BLOCK, dtype=torch.float32)
    padded[:out, :inn] = w
    blocks = padded.view(rb, BLOCK, cb, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).to(scale_dtype)
    q = (blocks / scale.float()[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(rb * BLOCK, cb * BLOCK)[:out, :inn].contiguous(), scale


def dequantize(q, scale):
    out, inn = q.shape
    full = scale.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out, :inn]
    return q.float() * full


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default="tests/fixtures/qwen3")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    tensors = load_file(os.path.join(args.src, "model.safetensors"))
    stored, dense = {}, {}
    for name, t in sorted(tensors.items()):
        if name.endswith("proj.weight") or name == "lm_head.weight":
            scale_dtype = torch.bfloat16 if ".layers.1." in name else torch.float32
            q, s = quantize(t.float(), scale_dtype)
            stored[name] = q
            stored[name[: -len(".weight")] + ".weight_scale_inv"] = s
            dense[name] = dequantize(q, s)
        else:
            stored[name] = t
            dense[name] = t.float()
    save_file(stored, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})

    with open(os.path.join(args.src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [BLOCK, BLOCK]}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    with open(os.path.join(args.src, "reference.json")) as f:
        ids = json.load(f)["ids"]
    model = AutoModelForCausalLM.from_pretrained(args.src, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    np.save(os.path.join(args.out, "logits.npy"), logits.astype(np.float32))
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"family": "qwen3", "weights": "fp8 e4m3 128x128 (dequantized in float32 for the logits)",
                   "transformers": transformers.__version__, "torch": torch.__version__, "ids": ids,
                   "logits": "logits.npy", "max_abs_logit": float(np.abs(logits).max())}, f, indent=2)
    print(f"qwen3-fp8: max |logit| {np.abs(logits).max():.3f}, "
          f"{sum(v.numel() * v.element_size() for v in stored.values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
