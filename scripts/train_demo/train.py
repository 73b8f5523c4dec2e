#!/usr/bin/env python3
"""Trains mere's embedded demo models: a byte-level BPE tokenizer, a small Qwen3 model and a
much smaller Qwen3 draft model sharing that tokenizer, on the corpus that prepare_corpus.sh
writes (KJV Bible + Python standard library). Runs on one GPU in a few minutes.

Writes, under --out:
  main/   config.json model.safetensors generation_config.json tokenizer.json tokenizer_config.json
  draft/  the same five files for the draft model
  loss.png  reference.json  heldout_test.txt  heldout.txt

Held-out perplexity is computed from the saved bf16 weights reloaded in float32 with the
sliding-window algorithm that `mere eval ppl --ctx 256 --stride 128` implements; see ppl().
"""
import argparse, copy, hashlib, inspect, json, math, os, shutil, time

import numpy as np
import torch
import torch.nn.functional as F

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PROMPTS = ["In the beginning God created",
           "Genesis\n\n1:1 In the beginning God created",   # how a book opens in the corpus
           "def fibonacci(n):\n",
           "import os\nimport sys\n\ndef main():\n"]

MAIN = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
            head_dim=64, intermediate_size=1024)
DRAFT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=64, intermediate_size=384)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(docs, vocab_size, out_dir, max_len):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {str(tok.token_to_id(t)): dict(content=t, lstrip=False, normalized=False, rstrip=False,
                                           single_word=False, special=True)
             for t in (EOT, IM_START, IM_END)}
    cfg = dict(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=False, add_prefix_space=False,
               bos_token=None, eos_token=EOT, pad_token=EOT, unk_token=None,
               model_max_length=max_len, clean_up_tokenization_spaces=False,
               added_tokens_decoder=added, chat_template=CHAT_TEMPLATE)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok


# ---------------------------------------------------------------- models

def make_config(shape, vocab, eot_id, max_pos):
    from transformers import Qwen3Config
    kw = dict(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=max_pos,
              rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, use_sliding_window=False,
              bos_token_id=None, eos_token_id=eot_id, pad_token_id=None, **shape)
    if "rope_parameters" in inspect.signature(Qwen3Config.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    return Qwen3Config(**kw)


def lr_at(step, progress, peak, warmup, min_frac=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(max(progress, 0.0), 1.0)
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def heldout_loss(model, windows, bs=64):
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i:i + bs]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                               reduction="sum")
        tot += loss.item(); cnt += w[:, 1:].numel()
    model.train()
    return tot / cnt


def train_model(name, config, data, held_windows, a, seconds, max_epochs, lr, batch):
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).cuda()
    assert model.lm_head.weight is model.model.embed_tokens.weight, "embeddings not tied"
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{name}: {n_params / 1e6:.3f}M parameters, attention {model.config._attn_implementation}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    T = a.seq_len
    tokens_per_step = batch * T
    max_steps = max(1, int(max_epochs * len(data) / tokens_per_step))
    if a.max_steps:
        max_steps = min(max_steps, a.max_steps)
    log(f"{name}: batch {batch}x{T}, step cap {max_steps} ({max_epochs} epochs), time cap {seconds}s, lr {lr}")
    gen = torch.Generator(device="cuda"); gen.manual_seed(1234)
    offs = torch.arange(T + 1, device="cuda")
    hist = {"step": [], "train": [], "heldout_step": [], "heldout": []}
    acc, acc_n = torch.zeros((), device="cuda"), 0
    train_time, step = 0.0, 0
    model.train()
    while True:
        t0 = time.time()
        progress = max(step / max_steps, train_time / seconds)
        if progress >= 1.0:
            break
        cur_lr = lr_at(step, progress, lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        starts = torch.randint(0, len(data) - T - 1, (batch,), device="cuda", generator=gen)
        w = data[starts[:, None] + offs].long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.detach(); acc_n += 1
        step += 1
        if step % a.log_every == 0:
            torch.cuda.synchronize()
        train_time += time.time() - t0
        if step % a.log_every == 0:
            hist["step"].append(step); hist["train"].append(acc.item() / acc_n)
            acc.zero_(); acc_n = 0
        if step % a.eval_every == 0:
            hl = heldout_loss(model, held_windows)
            hist["heldout_step"].append(step); hist["heldout"].append(hl)
            log(f"{name} step {step}/{max_steps} lr {cur_lr:.2e} train {hist['train'][-1]:.4f} "
                f"heldout {hl:.4f} ({train_time:.1f}s, {step * tokens_per_step / train_time / 1e6:.2f}M tok/s)")
    hl = heldout_loss(model, held_windows)
    if not hist["heldout_step"] or hist["heldout_step"][-1] != step:
        hist["heldout_step"].append(step); hist["heldout"].append(hl)
    log(f"{name}: done {step} steps in {train_time:.1f}s, {step * tokens_per_step / 1e6:.1f}M tokens "
        f"({step * tokens_per_step / len(data):.2f} epochs), final heldout loss {hl:.4f}")
    info = dict(params=n_params, steps=step, batch=batch, seq_len=T, tokens=step * tokens_per_step,
                epochs=step * tokens_per_step / len(data), train_seconds=round(train_time, 1),
                peak_lr=lr, final_heldout_loss_bf16=hl)
    return model, hist, info


def save_model(model, out_dir, tok_dir, eot_id):
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    os.makedirs(out_dir, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.dtype = torch.bfloat16
    m.save_pretrained(out_dir, safe_serialization=True)
    # No duplicate of the tied lm_head in the file: tie_word_embeddings says where it comes from.
    st = os.path.join(out_dir, "model.safetensors")
    with safe_open(st, "pt") as f:
        keys = list(f.keys())
        if "lm_head.weight" in keys:
            log(f"{out_dir}: dropping duplicate lm_head.weight")
            tensors = {k: f.get_tensor(k) for k in keys if k != "lm_head.weight"}
            save_file(tensors, st, metadata={"format": "pt"})
    with safe_open(st, "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}, dtypes
    # Readers that predate rope_parameters look for rope_theta at the top level.
    cp = os.path.join(out_dir, "config.json")
    cfg = json.load(open(cp))
    cfg.setdefault("rope_theta", 10000.0)
    cfg["torch_dtype"] = "bfloat16"
    json.dump(cfg, open(cp, "w"), indent=2, sort_keys=True)
    GenerationConfig(eos_token_id=eot_id, pad_token_id=eot_id, do_sample=True, temperature=0.8,
                     top_p=0.95, max_new_tokens=256).save_pretrained(out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(tok_dir) != os.path.abspath(out_dir):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    for f in sorted(os.listdir(out_dir)):
        log(f"  {out_dir}/{f}: {os.path.getsize(os.path.join(out_dir, f))} bytes")


# ---------------------------------------------------------------- evaluation (float32)

@torch.no_grad()
def ppl(model, ids, ctx, stride, device, bs=32):
    """Sliding-window perplexity, as `mere eval ppl --ctx C --stride S`:
    windows [begin, min(begin+ctx, n)) for begin = 0, S, 2S, ... until one ends at n; each
    window scores positions [max(prev_end, begin+1), end), predicting ids[i] from ids[begin:i]."""
    n = len(ids)
    wins, begin, prev_end = [], 0, 0
    while True:
        end = min(begin + ctx, n)
        first = max(prev_end, begin + 1)
        if first < end:
            wins.append((begin, end, first))
        prev_end = end
        if end == n:
            break
        begin += stride
    t = torch.tensor(ids, dtype=torch.long, device=device)
    total, scored = 0.0, 0
    by_len = {}
    for w in wins:
        by_len.setdefault(w[1] - w[0], []).append(w)
    for L, group in by_len.items():
        for i in range(0, len(group), bs):
            g = group[i:i + bs]
            x = torch.stack([t[b:e] for b, e, _ in g])
            lp = torch.log_softmax(model(input_ids=x, use_cache=False).logits.float(), dim=-1)
            for r, (b, e, first) in enumerate(g):
                pos = torch.arange(first, e, device=device)
                nll = -lp[r, pos - 1 - b, t[pos]]
                total += nll.double().sum().item(); scored += len(pos)
    assert scored == n - 1, (scored, n)
    return dict(tokens=n, scored=scored, windows=len(wins), nll=total,
                ppl=math.exp(total / scored))


@torch.no_grad()
def greedy(model, prompt_ids, n_new, eos, device):
    ids = list(prompt_ids)
    out = []
    for _ in range(n_new):
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
        nxt = int(logits[0, -1].float().argmax())
        ids.append(nxt); out.append(nxt)
        if nxt == eos:
            break
    return out


def evaluate(model_dir, tok, texts, a, device):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="eager").to(device).eval()
    res = {"ppl": {}, "greedy": []}
    for key, text in texts.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        res["ppl"][key] = ppl(m, ids, a.ctx, a.stride, device)
        log(f"{model_dir} {key}: ppl {res['ppl'][key]['ppl']:.4f} over {res['ppl'][key]['scored']} tokens")
    eos = tok.token_to_id(EOT)
    for p in PROMPTS:
        pids = tok.encode(p, add_special_tokens=False).ids
        out = greedy(m, pids, 64, eos, device)
        text = tok.decode(out, skip_special_tokens=False)
        res["greedy"].append(dict(prompt=p, prompt_ids=pids, output_ids=out, output_text=text))
        log(f"{model_dir} greedy {p!r} -> {text!r}")
        # Cross-check against transformers' own greedy generate.
        g = m.generate(torch.tensor([pids], device=device), max_new_tokens=64, do_sample=False,
                       temperature=None, top_p=None, top_k=None, repetition_penalty=1.0,
                       eos_token_id=eos, pad_token_id=eos)
        same = g[0, len(pids):].tolist() == out
        log(f"  generate() agrees: {same}")
    return res


def plot(hists, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(hists), figsize=(9, 3.4), dpi=90)
    for ax, (name, h) in zip(axes, hists.items()):
        ax.plot(h["step"], h["train"], lw=1, label="train")
        ax.plot(h["heldout_step"], h["heldout"], "o-", ms=2.5, lw=1, label="held-out")
        ax.set_title(f"{name} model"); ax.set_xlabel("step"); ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3); ax.legend()
    fig.tight_layout()
    fig.savefig(path)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".cache/demo_corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--max-pos", type=int, default=1024)
    ap.add_argument("--main-seconds", type=float, default=240)
    ap.add_argument("--draft-seconds", type=float, default=60)
    ap.add_argument("--main-epochs", type=float, default=4)
    ap.add_argument("--draft-epochs", type=float, default=16)
    ap.add_argument("--main-lr", type=float, default=1.5e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--max-steps", type=int, default=0, help="cap on steps (smoke tests)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--stride", type=int, default=128)
    ap.add_argument("--test-tokens", type=int, default=3000)
    a = ap.parse_args()
    t_start = time.time()
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    import transformers, tokenizers
    log(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")

    train_text = open(os.path.join(a.corpus, "train.txt"), encoding="utf-8").read()
    held_text = open(os.path.join(a.corpus, "heldout.txt"), encoding="utf-8").read()
    docs = train_text.split(EOT)
    log(f"corpus: {len(docs)} training documents, {len(train_text)} chars; heldout {len(held_text)} chars")

    main_dir, draft_dir = os.path.join(a.out, "main"), os.path.join(a.out, "draft")
    tok = train_tokenizer(docs, a.vocab, main_dir, a.max_pos)
    eot_id = tok.token_to_id(EOT)
    log(f"tokenizer: {tok.get_vocab_size()} tokens, eot id {eot_id} ({time.time() - t_start:.1f}s)")

    enc = tok.encode_batch(docs, add_special_tokens=False)
    stream = []
    for e in enc:
        stream.extend(e.ids); stream.append(eot_id)
    data = torch.tensor(np.array(stream, dtype=np.int32), device=dev)
    held_ids = tok.encode(held_text, add_special_tokens=False).ids
    log(f"train tokens {len(data)} ({len(train_text) / len(data):.2f} chars/token), heldout tokens {len(held_ids)}")
    T = a.seq_len
    hw = torch.tensor(held_ids[:len(held_ids) // (T + 1) * (T + 1)], device=dev).view(-1, T + 1)

    # CI test slice: the held-out text up to the last line break before token --test-tokens.
    enc_h = tok.encode(held_text, add_special_tokens=False)
    cut_char = enc_h.offsets[min(a.test_tokens, len(enc_h.ids) - 1)][0]
    cut = held_text.rfind("\n", 0, cut_char) + 1
    test_text = held_text[:cut]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "heldout_test.txt"), "w", encoding="utf-8") as f:
        f.write(test_text)
    shutil.copy(os.path.join(a.corpus, "heldout.txt"), os.path.join(a.out, "heldout.txt"))

    hists, infos = {}, {}
    for name, shape, secs, ep, lr, odir in (
            ("main", MAIN, a.main_seconds, a.main_epochs, a.main_lr, main_dir),
            ("draft", DRAFT, a.draft_seconds, a.draft_epochs, a.draft_lr, draft_dir)):
        cfg = make_config(shape, tok.get_vocab_size(), eot_id, a.max_pos)
        model, hists[name], infos[name] = train_model(name, cfg, data, hw, a, secs, ep, lr, a.batch)
        save_model(model, odir, main_dir, eot_id)
        del model
        torch.cuda.empty_cache()
    plot(hists, os.path.join(a.out, "loss.png"))

    # Evaluation: saved bf16 weights, reloaded in float32, no TF32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    texts = {"heldout.txt": held_text, "heldout_test.txt": test_text}
    evals = {name: evaluate(d, tok, texts, a, dev) for name, d in (("main", main_dir), ("draft", draft_dir))}

    try:  # the files load through transformers' tokenizer too, with the same ids
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(main_dir)
        same = at.encode(test_text, add_special_tokens=False) == tok.encode(test_text, add_special_tokens=False).ids
        log(f"AutoTokenizer ({type(at).__name__}) ids agree with tokenizers on heldout_test.txt: {same}")
        log("chat template: " + repr(at.apply_chat_template([{"role": "user", "content": "hi"}],
                                                            tokenize=False, add_generation_prompt=True)))
    except Exception as e:  # report, don't fail the run
        log(f"AutoTokenizer check failed: {e!r}")

    sha = lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest()
    ref = dict(
        eval=dict(dtype="float32", weights="bf16 safetensors as saved", ctx=a.ctx, stride=a.stride,
                  tokenization="tokenizer.json, no special tokens added"),
        files={"heldout.txt": dict(chars=len(held_text), sha256=sha(held_text)),
               "heldout_test.txt": dict(chars=len(test_text), sha256=sha(test_text))},
        tokenizer=dict(vocab_size=tok.get_vocab_size(), eot_id=eot_id,
                       im_start_id=tok.token_to_id(IM_START), im_end_id=tok.token_to_id(IM_END),
                       train_tokens=len(data)),
        models={name: dict(training=infos[name], ppl=evals[name]["ppl"], greedy=evals[name]["greedy"])
                for name in ("main", "draft")},
        greedy_rule="argmax of float32 logits, 64 new tokens or through <|endoftext|>, no repetition penalty",
        loss_history=hists,
    )
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    log(f"all done in {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    main()
