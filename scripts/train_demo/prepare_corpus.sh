#!/usr/bin/env bash
# Builds the demo corpus for scripts/train_demo/train.py from two Debian packages:
#   bible-kjv-text   the King James Bible (public domain), read through the `bible`
#                    program of package bible-kjv (the data file is a compressed binary)
#   libpython3.11-*  the Python 3.11 standard library sources in /usr/lib/python3.11
#                    (Python Software Foundation License)
# Output: .cache/demo_corpus/{train.txt,heldout.txt,manifest.txt} (git-ignored).
# train.txt separates documents with <|endoftext|>; heldout.txt separates them with a
# blank line and holds no special tokens, so any tokenizer reads it the same way.
# The split is deterministic: the twelve minor prophets (Hosea..Malachi) and every
# 40th Python file (sorted by path) are held out.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.cache/demo_corpus
PYLIB=/usr/lib/python3.11

if ! command -v bible >/dev/null || [ ! -f /usr/lib/bible.data ]; then
  apt-get install -y bible-kjv bible-kjv-text
fi
mkdir -p "$OUT"
# -f: one verse a line, "Ge1:1 In the beginning ..."; no line wrapping.
bible -f "gen1:1-rev22:21" </dev/null >"$OUT/kjv_raw.txt"

python3 - "$OUT" "$PYLIB" <<'PY'
import os, re, sys, hashlib
out, pylib = sys.argv[1], sys.argv[2]
EOT = "<|endoftext|>"
NAMES = """Genesis|Exodus|Leviticus|Numbers|Deuteronomy|Joshua|Judges|Ruth|1 Samuel|2 Samuel|
1 Kings|2 Kings|1 Chronicles|2 Chronicles|Ezra|Nehemiah|Esther|Job|Psalms|Proverbs|Ecclesiastes|
Song of Solomon|Isaiah|Jeremiah|Lamentations|Ezekiel|Daniel|Hosea|Joel|Amos|Obadiah|Jonah|Micah|
Nahum|Habakkuk|Zephaniah|Haggai|Zechariah|Malachi|Matthew|Mark|Luke|John|Acts|Romans|
1 Corinthians|2 Corinthians|Galatians|Ephesians|Philippians|Colossians|1 Thessalonians|
2 Thessalonians|1 Timothy|2 Timothy|Titus|Philemon|Hebrews|James|1 Peter|2 Peter|1 John|2 John|
3 John|Jude|Revelation""".replace("\n", "").split("|")
assert len(NAMES) == 66
HELDOUT_BOOKS = set(NAMES[NAMES.index("Hosea"):NAMES.index("Malachi") + 1])

# --- Bible: one document per book: title, blank line, "c:v text" a line, blank line between chapters.
books, cur_abbr = [], None
for line in open(os.path.join(out, "kjv_raw.txt"), encoding="utf-8"):
    line = line.rstrip("\n")
    if not line:
        continue
    m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
    assert m, line
    abbr, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
    if abbr != cur_abbr:
        books.append({"name": NAMES[len(books)], "lines": [], "ch": None})
        cur_abbr = abbr
    b = books[-1]
    if b["ch"] is not None and ch != b["ch"]:
        b["lines"].append("")
    b["ch"] = ch
    b["lines"].append(f"{ch}:{vs} {text}")
assert len(books) == 66, len(books)
bible_docs = [(b["name"], b["name"] + "\n\n" + "\n".join(b["lines"]) + "\n") for b in books]

# --- Python standard library: every .py file outside __pycache__, test suites and
# generated tables over 300 kB (pydoc_data/topics.py), one document per file.
py_files = []
for root, dirs, files in os.walk(pylib):
    dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "test", "tests", "idle_test",
                                                  "site-packages", "dist-packages"))
    for f in sorted(files):
        if f.endswith(".py"):
            p = os.path.join(root, f)
            if os.path.getsize(p) <= 300_000:
                py_files.append(os.path.relpath(p, pylib))
py_files.sort()
py_docs = []
for rel in py_files:
    text = open(os.path.join(pylib, rel), encoding="utf-8", errors="strict").read()
    text = text.replace(EOT, "")
    if text.strip():
        py_docs.append((rel, text.rstrip("\n") + "\n"))

held_py = [d for i, d in enumerate(py_docs) if i % 40 == 20]
train_py = [d for i, d in enumerate(py_docs) if i % 40 != 20]
held_bible = [d for d in bible_docs if d[0] in HELDOUT_BOOKS]
train_bible = [d for d in bible_docs if d[0] not in HELDOUT_BOOKS]

# Training documents: Bible books and Python files interleaved in a fixed shuffled order.
train_docs = train_bible + train_py
train_docs.sort(key=lambda d: hashlib.sha1(d[0].encode()).hexdigest())
with open(os.path.join(out, "train.txt"), "w", encoding="utf-8") as f:
    f.write(EOT.join(t for _, t in train_docs))

# Held-out: prose and code alternate, shortest book first, Python files from the shortest
# one over 4 kB upward (then the tiny ones), so the first few thousand tokens (the CI test
# slice) hold both.
held_bible.sort(key=lambda d: len(d[1])); held_py.sort(key=lambda d: len(d[1]))
k = next(i for i, d in enumerate(held_py) if len(d[1]) >= 4000)
held_py = held_py[k:] + held_py[:k]   # start with a file of some substance
held = []
for i in range(max(len(held_bible), len(held_py))):
    held += held_bible[i:i + 1] + held_py[i:i + 1]
with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(t for _, t in held))

with open(os.path.join(out, "manifest.txt"), "w") as f:
    f.write("# train\n" + "".join(f"{n}\t{len(t)}\n" for n, t in train_docs))
    f.write("# heldout\n" + "".join(f"{n}\t{len(t)}\n" for n, t in held))
tb = sum(len(t) for _, t in train_docs); hb = sum(len(t) for _, t in held)
print(f"train: {len(train_docs)} docs ({len(train_bible)} books, {len(train_py)} .py), {tb} chars")
print(f"heldout: {len(held)} docs ({len(held_bible)} books, {len(held_py)} .py), {hb} chars")
PY
rm -f "$OUT/kjv_raw.txt"
ls -l "$OUT"
