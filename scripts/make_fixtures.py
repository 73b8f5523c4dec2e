#!/usr/bin/env python3
"""Reference fixtures for mere's model tests, made with Hugging Face transformers.

Run on the GPU machine (any machine with torch + transformers + tokenizers):
    python3 scripts/make_fixtures.py --out DIR
Writes DIR/fixtures.tar holding, for each family, a tiny random-weight checkpoint
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) and reference.json + logits.npy: float32 logits of a fixed
id sequence and a 32-token greedy continuation, computed on the CPU in float32
from the saved weights. Also rope_reference.json: inverse frequencies and
attention factors of each RoPE scaling type, from transformers' own rotary classes.
Extract into tests/fixtures/.
"""
import argparse
import copy
import inspect
import json
import os
import tarfile
import tempfile

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

VOCAB = 512
PROMPT_LEN = 24
GREEDY_TOKENS = 32

FAMILIES = {
    # Llama 3 rope scaling, GQA, bf16 weights; written back in the legacy config layout.
    "llama": dict(
        cls="LlamaConfig", dtype=torch.bfloat16, legacy_layout=True,
        kwargs=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64))),
    # Attention bias, tied embeddings, linear rope scaling, f16 weights.
    "qwen2": dict(
        cls="Qwen2Config", dtype=torch.float16, legacy_layout=False,
        kwargs=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    # q/k norm, head_dim (32) != hidden/heads (16), yarn rope scaling, f32 weights.
    "qwen3": dict(
        cls="Qwen3Config", dtype=torch.float32, legacy_layout=False,
        kwargs=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                         original_max_position_embeddings=256))),
}

# RoPE variants checked against transformers' rotary embedding classes.
ROPE_CASES = [
    ("llama", dict(rope_type="default", rope_theta=10000.0), {}),
    ("llama", dict(rope_type="default", rope_theta=500000.0), dict(head_dim=128)),
    ("llama", dict(rope_type="linear", rope_theta=10000.0, factor=4.0), {}),
    ("llama", dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192),
     dict(head_dim=128, max_position_embeddings=131072)),
    ("llama", dict(rope_type="llama3", rope_theta=10000.0, factor=32.0, low_freq_factor=2.0,
                   high_freq_factor=8.0, original_max_position_embeddings=128), {}),
    ("qwen3", dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0), dict(max_position_embeddings=32768)),
    ("qwen3", dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32768),
     dict(max_position_embeddings=131072)),
    ("qwen3", dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, beta_fast=16.0, beta_slow=2.0,
                   attention_factor=1.5), dict(max_position_embeddings=4096)),
    ("qwen3", dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, mscale=1.0, mscale_all_dim=0.707,
                   original_max_position_embeddings=4096), dict(max_position_embeddings=163840)),
    ("qwen3", dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, truncate=False),
     dict(max_position_embeddings=8192)),
]

TOKENIZER_TEXT = """In the beginning was the word, and the word was with code.
def forward(self, hidden_states, attention_mask=None):
    return self.mlp(self.norm(hidden_states)) + hidden_states
The quick brown fox jumps over the lazy dog. 0123456789 !?.,;: ()[]{} <> + - * / = _ #
"""


def train_tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = TOKENIZER_TEXT + inspect.getsource(transformers.models.llama.modeling_llama)
    tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


def randomize(model, seed):
    # Random everywhere, never zeros or ones: norms near 1, biases small, matrices wide
    # enough that logits spread and greedy decoding does not collapse.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def to_legacy_layout(config_path):
    """Rewrite transformers-5 rope_parameters as rope_theta + rope_scaling, as most checkpoints have it."""
    with open(config_path) as f:
        c = json.load(f)
    params = c.pop("rope_parameters")
    c["rope_theta"] = params.pop("rope_theta")
    if params.get("rope_type", "default") != "default":
        c["rope_scaling"] = params
    with open(config_path, "w") as f:
        json.dump(c, f, indent=2)


def make_family(name, spec, root, seed):
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    train_tokenizer(path)
    config = getattr(transformers, spec["cls"])(**spec["kwargs"], bos_token_id=None, eos_token_id=0,
                                                pad_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize(model, seed)
    model.to(spec["dtype"]).save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 0, "do_sample": False}, f, indent=2)

    # The reference: the saved weights, upcast to float32, on the CPU.
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(1, VOCAB, (1, PROMPT_LEN), generator=g)
    with torch.no_grad():
        logits = ref(ids).logits[0].float().numpy()
        seq = ids.clone()
        for _ in range(GREEDY_TOKENS):
            nxt = ref(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    np.save(os.path.join(path, "logits.npy"), logits.astype(np.float32))
    greedy = seq[0, PROMPT_LEN:].tolist()

    if spec["legacy_layout"]:
        to_legacy_layout(os.path.join(path, "config.json"))
        again = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            diff = (again(ids).logits[0].float().numpy() - logits).__abs__().max()
        assert diff < 1e-5, f"{name}: legacy config layout changed the logits by {diff}"

    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump({"family": name, "weights_dtype": str(spec["dtype"]).replace("torch.", ""),
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "ids": ids[0].tolist(), "greedy": greedy, "logits": "logits.npy",
                   "max_abs_logit": float(np.abs(logits).max())}, f, indent=2)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {size / 1e6:.2f} MB, max |logit| {np.abs(logits).max():.3f}, greedy {greedy[:8]}...")
    assert size < 2e6, f"{name} fixture is {size} bytes"


def rope_reference():
    cases = []
    for family, params, extra in ROPE_CASES:
        kwargs = dict(vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)
        kwargs.update(extra)
        cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[family]
        config = cls(**kwargs, rope_parameters=copy.deepcopy(params))
        model_mod = {"llama": transformers.models.llama.modeling_llama,
                     "qwen3": transformers.models.qwen3.modeling_qwen3}[family]
        rotary = getattr(model_mod, {"llama": "LlamaRotaryEmbedding", "qwen3": "Qwen3RotaryEmbedding"}[family])(config)
        cases.append({"config": config.to_dict(),
                      "inv_freq": rotary.inv_freq.float().tolist(),
                      "attention_factor": float(rotary.attention_scaling)})
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    root = tempfile.mkdtemp()
    for seed, (name, spec) in enumerate(FAMILIES.items()):
        make_family(name, spec, root, 1000 + seed)
    with open(os.path.join(root, "rope_reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "cases": rope_reference()}, f)
    os.makedirs(args.out, exist_ok=True)
    with tarfile.open(os.path.join(args.out, "fixtures.tar"), "w") as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(os.path.join(root, entry), arcname=entry)
    from transformers import modeling_rope_utils
    with open(os.path.join(args.out, "rope_utils_source.py"), "w") as f:
        f.write(inspect.getsource(modeling_rope_utils))
    print("wrote", os.path.join(args.out, "fixtures.tar"))


if __name__ == "__main__":
    main()
