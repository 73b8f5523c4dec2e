#!/usr/bin/env python3
"""Qwen3-MoE reference fixtures for mere's tests, made with Hugging Face transformers.

Run on the GPU machine (any machine with torch, transformers, tokenizers, safetensors):
    python3 scripts/make_moe_fixtures.py --out DIR
Writes DIR/moe_fixtures.tar with, in the format of scripts/make_fixtures.py
(config.json, model.safetensors, tokenizer files, generation_config.json,
reference.json, logits.npy: float32 CPU logits of a fixed id sequence and a
32-token greedy continuation):
  qwen3_moe        f32, 8 experts, top 2, norm_topk_prob, layer 1 dense (mlp_only_layers),
                   experts stored one module per expert as published checkpoints are
                   (model.layers.L.mlp.experts.E.gate_proj.weight ...)
  qwen3_moe-step2  bf16, 6 experts, top 3, no renormalisation, decoder_sparse_step 2
                   (layers 1 and 3 sparse), experts stored as
                   transformers 5 holds them (mlp.experts.gate_up_proj [E, 2f, d],
                   mlp.experts.down_proj [E, d, f])
  qwen3_moe-mlx4   qwen3_moe in mlx-lm's layout and quantization: experts stacked
                   (mlp.switch_mlp.gate_proj [E, f, d] ...), every matrix affine int4
                   g32 except the routers (int8, per-module overrides as mlx-lm writes
                   them); reference logits from the dequantized weights.
Extract into tests/fixtures/.
"""
import argparse
import json
import os
import sys
import tarfile
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import GREEDY_TOKENS, PROMPT_LEN, VOCAB, randomize, train_tokenizer  # noqa: E402
from make_quant_fixtures import affine_quantize, as_torch_u32, pack, to_dtype  # noqa: E402

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0))

CASES = {
    "qwen3_moe": dict(dtype=torch.float32, layout="per_expert",
                      kwargs=dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                  decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=False)),
    "qwen3_moe-step2": dict(dtype=torch.bfloat16, layout="packed",
                            kwargs=dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
                                        decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=False)),
}


def expert_matrices(state):
    """{(layer prefix, e): (gate [f, d], up [f, d], down [d, f])} from either layout."""
    out = {}
    for key, t in state.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key[: -len("experts.gate_up_proj")]
            f = t.shape[1] // 2
            down = state[prefix + "experts.down_proj"]
            for e in range(t.shape[0]):
                out[(prefix, e)] = (t[e, :f], t[e, f:], down[e])
        elif key.endswith("mlp.switch_mlp.gate_proj.weight"):
            prefix = key[: -len("switch_mlp.gate_proj.weight")]
            up, down = state[prefix + "switch_mlp.up_proj.weight"], state[prefix + "switch_mlp.down_proj.weight"]
            for e in range(t.shape[0]):
                out[(prefix, e)] = (t[e], up[e], down[e])
        elif ".mlp.experts." in key and key.endswith("gate_proj.weight"):
            prefix, rest = key.split("experts.")
            e = int(rest.split(".")[0])
            p = f"{prefix}experts.{e}."
            out[(prefix, e)] = (t, state[p + "up_proj.weight"], state[p + "down_proj.weight"])
    return out


def relayout(state, layout):
    """The state dict with experts stored as `layout`: per_expert, packed or switch_mlp (stacked)."""
    experts = expert_matrices(state)
    out = {k: v for k, v in state.items() if ".mlp.experts." not in k and ".mlp.switch_mlp." not in k}
    prefixes = sorted({p for p, _ in experts})
    for prefix in prefixes:
        n = max(e for p, e in experts if p == prefix) + 1
        mats = [experts[(prefix, e)] for e in range(n)]
        if layout == "per_expert":
            for e, (g, u, d) in enumerate(mats):
                out[f"{prefix}experts.{e}.gate_proj.weight"] = g.contiguous()
                out[f"{prefix}experts.{e}.up_proj.weight"] = u.contiguous()
                out[f"{prefix}experts.{e}.down_proj.weight"] = d.contiguous()
        elif layout == "packed":
            out[prefix + "experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u, _ in mats]).contiguous()
            out[prefix + "experts.down_proj"] = torch.stack([d for _, _, d in mats]).contiguous()
        else:
            for i, name in enumerate(["gate_proj", "up_proj", "down_proj"]):
                out[f"{prefix}switch_mlp.{name}.weight"] = torch.stack([m[i] for m in mats]).contiguous()
    return out


def reference(path, ids, seed):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return run(model, ids)


def run(model, ids):
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        seq = ids.clone()
        for _ in range(GREEDY_TOKENS):
            nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return logits, seq[0, ids.shape[1]:].tolist()


def write_reference(path, name, dtype, ids, logits, greedy, extra=None):
    np.save(os.path.join(path, "logits.npy"), logits.astype(np.float32))
    ref = {"family": "qwen3_moe", "weights_dtype": str(dtype).replace("torch.", ""),
           "transformers": transformers.__version__, "torch": torch.__version__,
           "ids": ids[0].tolist(), "greedy": greedy, "logits": "logits.npy",
           "max_abs_logit": float(np.abs(logits).max())}
    ref.update(extra or {})
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {size / 1e6:.2f} MB, max |logit| {np.abs(logits).max():.3f}, greedy {greedy[:8]}...")
    assert size < 2e6, f"{name} fixture is {size} bytes"


def make_case(name, spec, root, seed):
    path = os.path.join(root, name)
    os.makedirs(path)
    train_tokenizer(path)
    config = transformers.Qwen3MoeConfig(**BASE, **spec["kwargs"], bos_token_id=None, eos_token_id=0,
                                         pad_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize(model, seed)
    with torch.no_grad():  # routers wide enough that the experts' scores spread
        for n, p in model.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.mul_(4.0)
    model = model.to(spec["dtype"]).eval()
    print(name, "parameters:", {k: tuple(v.shape) for k, v in model.state_dict().items() if "layers.0.mlp" in k})
    config.dtype = spec["dtype"]  # as save_pretrained records it
    config.save_pretrained(path)
    state = relayout({k: v.detach() for k, v in model.state_dict().items()}, spec["layout"])
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f, indent=2)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(1, VOCAB, (1, PROMPT_LEN), generator=g)
    logits, greedy = reference(path, ids, seed)
    # The saved layout must load back to the model we made (a fresh float32 copy:
    # buffers such as RoPE's inverse frequencies must not keep a bf16 rounding).
    check = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    check.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        direct = check(ids).logits[0].float().numpy()
    diff = np.abs(direct - logits).max()
    assert diff < 1e-4, f"{name}: the {spec['layout']} layout reloads with logits off by {diff}"
    write_reference(path, name, spec["dtype"], ids, logits, greedy, {"expert_layout": spec["layout"]})
    return path, ids


def make_mlx4(source, ids, root, bits=4, group=32, router_bits=8):
    """The source fixture in mlx-lm's stacked layout, affine-quantized; reference from the dequantized weights."""
    name = "qwen3_moe-mlx4"
    path = os.path.join(root, name)
    os.makedirs(path)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager").eval()
    state = relayout({k: v.detach().clone() for k, v in model.state_dict().items()}, "switch_mlp")
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tensors, dequantized, overrides = {}, {}, {}
    for key, t in sorted(state.items()):
        if not (key.endswith(".weight") and t.dim() in (2, 3) and t.shape[-1] % group == 0):
            tensors[key] = t
            continue
        module = key[: -len(".weight")]
        b = router_bits if module.endswith("mlp.gate") else bits
        if b != bits:
            overrides[module] = {"group_size": group, "bits": b}
        w = t.float().numpy().reshape(-1, t.shape[-1])
        codes, scale, bias = affine_quantize(w, b, group)
        scales, biases = to_dtype(scale, t.dtype), to_dtype(bias, t.dtype)
        lead = tuple(t.shape[:-1])
        tensors[key] = as_torch_u32(pack(codes, b)).reshape(*lead, -1)
        tensors[module + ".scales"] = scales.reshape(*lead, -1)
        tensors[module + ".biases"] = biases.reshape(*lead, -1)
        deq = scales.float().numpy().repeat(group, axis=1) * codes.astype(np.float32) + \
            biases.float().numpy().repeat(group, axis=1)
        dequantized[key] = torch.from_numpy(deq.astype(np.float32)).reshape(t.shape)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "mlx"})
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    q = {"group_size": group, "bits": bits, **overrides}
    config["quantization"] = q
    config["quantization_config"] = q
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f, indent=2)
    # Put the dequantized weights into the float32 model, whatever its expert layout.
    deq_state = {k: v for k, v in state.items()}
    deq_state.update(dequantized)
    want = relayout(deq_state, "packed" if any(k.endswith("experts.gate_up_proj") for k in model.state_dict())
                    else "per_expert")
    params = model.state_dict()
    with torch.no_grad():
        for key, p in params.items():
            assert key in want and want[key].shape == p.shape, key
            p.copy_(want[key])
    logits, greedy = run(model, ids)
    write_reference(path, name, torch.float32, ids, logits, greedy,
                    {"source": "qwen3_moe", "bits": bits, "group_size": group, "router_bits": router_bits,
                     "expert_layout": "switch_mlp"})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    root = tempfile.mkdtemp()
    made = {}
    for seed, (name, spec) in enumerate(CASES.items()):
        made[name] = make_case(name, spec, root, 2000 + seed)
    make_mlx4(*made["qwen3_moe"], root)
    os.makedirs(args.out, exist_ok=True)
    with tarfile.open(os.path.join(args.out, "moe_fixtures.tar"), "w") as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(os.path.join(root, entry), arcname=entry)
    print("wrote", os.path.join(args.out, "moe_fixtures.tar"))


if __name__ == "__main__":
    main()
