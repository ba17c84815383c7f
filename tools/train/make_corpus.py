#!/usr/bin/env python3
"""Builds the demo model's training corpus and chat set from Debian packages (fetched by fetch_sources.sh).

Sources (each a list of documents; a document is the unit of de-duplication and of the held-out split):
  kjv       bible-kjv-text: the King James Bible, one document per chapter, one verse per line
            ("Genesis 1:3 And God said, Let there be light: and there was light."). The text is compressed in a
            format only bible-kjv's `bible` program reads; it is run from the unpacked package (never installed).
  gcide     dict-gcide: one document per dictionary entry, markup stripped to "Word (part of speech): definition"
            prose: pronunciation, etymology, source tags ([1913 Webster]) and literary quotations dropped.
  python    python3.11-doc's info file (the Python 3.11 documentation as Sphinx's texinfo builder writes it), one
            document per info node; What's New, the legacy distutils guides, the licence and about pages, the
            menus, footnotes and cross-reference targets are dropped.
  man       manpages + manpages-dev: each page rendered by groff to plain text (left-adjusted, no hyphenation).
  fortunes  fortunes-min + fortunes: one document per fortune, some files left out (FORTUNE_SKIP) and entries
            containing a few words (PROFANITY) dropped.

Every document is NFC-normalised, curly quotes and Unicode hyphens made ASCII, control characters removed, tabs
expanded, trailing spaces stripped and runs of blank lines collapsed; exact duplicates (after that) are dropped,
first occurrence kept. A document is held out when sha256("source/key") puts it in the first HELDOUT_PER_10K of
10,000 buckets (~2%), so the split never depends on the order or on the other documents.

Outputs (in --out, default build/corpus):
  train.txt, heldout.txt   documents in a seeded shuffled order, each ending in "\\n" and followed by
                           "<|endoftext|>\\n" (train_demo.py splits on that and puts the token in between)
  chat.jsonl               {"source", "user", "assistant"} pairs made from TRAIN documents only: a word's definition,
                           a verse, a fortune, what a Python function or a man page is for, plus a few hand-written
                           identity answers and small sums (source "synthetic")
  chat_heldout.jsonl       the same made from held-out documents (for evaluating the chat phase)
  manifest.json            packages (versions, .deb sha256, licences from their copyright files), per-source and
                           per-file sizes, line counts and sha256, the settings
  pretrain.tar.gz          train.txt + heldout.txt           } what travels to the GPU machine (deterministic
  chat.tar.gz              chat*.jsonl + manifest.json       }  archives: mtime 0, root owner, sorted)

Deterministic: the same packages give byte-identical outputs. Needs python3, dpkg-deb and groff (Debian 12).
Usage: make_corpus.py [--debs build/corpus-debs] [--out build/corpus] [--seed 1234]
"""
import argparse
import collections
import glob
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import unicodedata

HELDOUT_PER_10K = 200  # 2% of documents
EOT = "<|endoftext|>"

# Where the text of each source comes from (for the manifest).
SOURCE_PACKAGES = {
    "kjv": ["bible-kjv-text"],
    "gcide": ["dict-gcide"],
    "python": ["python3.11-doc"],
    "man": ["manpages", "manpages-dev"],
    "fortunes": ["fortunes-min", "fortunes"],
}
TOOL_PACKAGES = {"bible-kjv": "its `bible` program decompresses bible-kjv-text; none of its files are in the corpus"}

# Reviewed summaries of each package's /usr/share/doc/PKG/copyright; the manifest also records the file's
# sha256 and the licence names found in it, so a changed copyright file shows.
LICENCE_SUMMARY = {
    "bible-kjv-text": "King James Version text (1611): public domain (expired copyright, as the copyright file "
                      "states); the Debian package's software is GPL-2+",
    "bible-kjv": "GPL-2+ (tool only, not part of the corpus)",
    "dict-gcide": "GCIDE: GPL-2+ (derived from Webster's Revised Unabridged Dictionary of 1913, public domain, "
                  "and WordNet 1.5 under the WordNet licence); the dictd formatting software is under its own "
                  "free licence",
    "python3.11-doc": "Python 3.11 documentation: PSF License Version 2 (with the BeOpen, CNRI and CWI licences "
                      "of Python's history; code examples also Zero-Clause BSD), see the copyright file",
    "manpages": "Linux man-pages: per page GPL-2+, GPL-2, GPL-1+, BSD-2/3/4-clause, Expat or the "
                "Linux-man-pages-copyleft (verbatim) licence, as the DEP-5 copyright file lists",
    "manpages-dev": "Linux man-pages (sections 2 and 3): per page GPL-2+, GPL-2, BSD-2/3/4-clause, Expat or "
                    "the Linux-man-pages-copyleft (verbatim) licence, as the DEP-5 copyright file lists",
    "fortunes-min": "fortune-mod: BSD-3-clause (University of California); the fortune files are collected "
                    "quotations distributed with the package",
    "fortunes": "fortune-mod: BSD-3-clause (University of California); the fortune files are collected "
                "quotations distributed with the package",
}

# ---------------------------------------------------------------------------------------------------------
# Text normalisation

_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-",
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ",
    "\u2022": "*", "\u2026": "...",
})
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028\u2029\u2060\ufeff\ufffd]")
_BLANKS = re.compile(r"\n{3,}")


def normalise(text):
    """NFC, ASCII quotes and hyphens, no control characters, tabs expanded, no trailing spaces, at most one
    blank line in a row, no leading or trailing blank lines; ends with one newline ("" when empty)."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text.translate(_TRANSLATE))
    text = "\n".join(line.expandtabs(8).rstrip() for line in text.split("\n"))
    text = _BLANKS.sub("\n\n", text).strip("\n")
    return text + "\n" if text.strip() else ""


def unwrap(text):
    """Joins wrapped lines into one line and collapses whitespace."""
    return re.sub(r"\s+", " ", text).strip()


def first_sentences(text, limit):
    """As many whole sentences of TEXT as fit in LIMIT characters (at least the first, cut at a word)."""
    text = unwrap(text)
    if len(text) <= limit:
        return text
    cut = [m.end() for m in re.finditer(r"[.!?](?=\s+[A-Z(\"'])", text) if m.end() <= limit]
    if cut:
        return text[:cut[-1]]
    return text[:limit].rsplit(" ", 1)[0] + " ..."


class Doc:
    __slots__ = ("source", "key", "text", "meta")

    def __init__(self, source, key, text, meta=None):
        self.source, self.key, self.text, self.meta = source, key, text, meta or {}


def is_heldout(source, key):
    h = hashlib.sha256(f"{source}/{key}".encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") % 10000 < HELDOUT_PER_10K


# ---------------------------------------------------------------------------------------------------------
# King James Bible

KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai",
    "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter", "2 Peter",
    "1 John", "2 John", "3 John", "Jude", "Revelation",
]


def kjv_docs(root):
    program = os.path.join(root, "usr/bin/bible")
    data = os.path.join(root, "usr/lib")
    if not os.path.exists(os.path.join(data, "bible.data")):
        raise SystemExit(f"make_corpus.py: {data}/bible.data missing (run tools/train/fetch_sources.sh)")
    try:
        out = subprocess.run([program, "-f", "-p", data, "Gen1:1-Rev22:21"], check=True, capture_output=True,
                             env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"make_corpus.py: {program}: {e} (it needs libreadline8)")
    abbrevs, chapters = [], collections.OrderedDict()
    for line in out.decode("latin-1").splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise SystemExit(f"make_corpus.py: bible: unexpected line {line[:60]!r}")
        abbrev, chapter, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if not abbrevs or abbrevs[-1] != abbrev:
            abbrevs.append(abbrev)
        book = KJV_BOOKS[len(abbrevs) - 1] if len(abbrevs) <= len(KJV_BOOKS) else None
        chapters.setdefault((book, chapter), []).append((verse, text))
    if len(abbrevs) != 66 or sum(len(v) for v in chapters.values()) != 31102:
        raise SystemExit(f"make_corpus.py: bible: {len(abbrevs)} books / "
                         f"{sum(len(v) for v in chapters.values())} verses, expected 66 / 31102")
    docs = []
    for (book, chapter), verses in chapters.items():
        text = "".join(f"{book} {chapter}:{v} {t}\n" for v, t in verses)
        docs.append(Doc("kjv", f"{book} {chapter}", text, {"book": book, "chapter": chapter, "verses": verses}))
    return docs


# ---------------------------------------------------------------------------------------------------------
# GCIDE

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _b64(s):
    v = 0
    for c in s:
        v = v * 64 + _B64[c]
    return v


GCIDE_LABELS = {
    "Obs.": "obsolete", "R.": "rare", "Colloq.": "colloquial", "Collog.": "colloquial", "colloq.": "colloquial",
    "Archaic": "archaic", "Archaic.": "archaic", "archaic": "archaic", "Slang": "slang", "slang": "slang",
    "Slang.": "slang", "Poetic": "poetic", "Poetic.": "poetic", "Poet.": "poetic", "Scot.": "Scottish",
    "U.S.": "U.S.", "Eng.": "English", "Prov. Eng.": "provincial English", "Obsoles.": "obsolescent",
    "informal": "informal", "Informal": "informal", "British": "British", "Brit.": "British", "Cant": "cant",
    "Low": "low", "Humorous": "humorous", "Jocose": "jocose", "Jocular": "jocular", "Recent": "recent",
    "Rare": "rare", "Ireland": "Ireland", "India": "India", "Canada": "Canada", "fig.": "figurative",
    "vulgar": "vulgar", "Vulgar": "vulgar",
}
GCIDE_CODES = {
    "ae": "\u00e6", "AE": "\u00c6", "oe": "\u0153", "OE": "\u0152", "=ae": "\u00e6", ",c": "\u00e7",
    "~n": "\u00f1", "~a": "\u00e3", "deg": "\u00b0", "eth": "\u00f0", "thorn": "\u00fe", "root": "\u221a",
    "sect": "\u00a7", "pounds": "\u00a3", "prime": "'", "bprime": '"', "sec": '"', "min": "'", "yogh": "\u021d",
    "alpha": "\u03b1", "beta": "\u03b2", "gamma": "\u03b3", "delta": "\u03b4", "Delta": "\u0394",
    "epsilon": "\u03b5", "theta": "\u03b8", "lambda": "\u03bb", "mu": "\u03bc", "pi": "\u03c0",
    "sigma": "\u03c3", "Sigma": "\u03a3", "phi": "\u03c6", "Upsilon": "\u03a5", "omega": "\u03c9",
    "Omega": "\u03a9", "flat": "\u266d", "sharp": "\u266f", "natural": "\u266e", "aum": "\u00e4",
    "oum": "\u00f6", "uum": "\u00fc", "eum": "\u00eb", "ium": "\u00ef", "acir": "\u00e2", "ecir": "\u00ea",
    "icir": "\u00ee", "ocir": "\u00f4", "ucir": "\u00fb", "imac": "i", "add": "", "asl": "", "udd": "",
    "dsdot": "", "ng": "ng", "th": "th", "?": "",
}
_ACCENT = {"'": "\u0301", "`": "\u0300", '"': "\u0308"}
_CODE = re.compile(r"\[(['`\"^~=.*,-]?)([A-Za-z]{1,2}|[a-zA-Z]+|\?)(\^|~|=)?\]")
_LABEL = re.compile(r"\[(" + "|".join(re.escape(k) for k in sorted(GCIDE_LABELS, key=len, reverse=True)) + r")\]")
_SOURCE_TAG = re.compile(r"^\s*\[(?:[^\]]*(?:Webster|WordNet|PJC|RHUD|RDH|MW10|NRT|AS|DOI|Century|Chambers|"
                         r"Nautical|Stedman|Dictionary|Dict|Cycl|Encyc|Bible|Johnson|Latham|Ure|Craig|Gov|"
                         r"Knight|Wright|Mahn|Goodrich|Porter)[^\]]*|[A-Z][A-Za-z0-9.]{1,6})\]\s*$")
GCIDE_POS = {
    "n.": "noun", "n. pl.": "plural noun", "pl.": "plural noun", "n.pl.": "plural noun", "v. t.": "verb",
    "v. i.": "verb", "v.": "verb", "v. t. & i.": "verb", "v. i. & t.": "verb", "a.": "adjective",
    "adj.": "adjective", "adv.": "adverb", "prep.": "preposition", "conj.": "conjunction",
    "interj.": "interjection", "pron.": "pronoun", "p. p.": "past participle", "p. a.": "adjective",
    "p. pr.": "present participle", "imp.": "past tense", "superl.": "superlative", "compar.": "comparative",
    "a. & n.": "adjective and noun", "n. & a.": "noun and adjective", "a. & adv.": "adjective and adverb",
    "adv. & a.": "adverb and adjective", "v. t. & n.": "verb and noun", "n. & v.": "noun and verb",
}


def _gcide_code(m):
    mark, letters, post = m.group(1), m.group(2), m.group(3)
    whole = mark + letters + (post or "")
    if whole in GCIDE_CODES:
        return GCIDE_CODES[whole]
    if letters in GCIDE_CODES and not mark and not post and len(letters) > 2:
        return GCIDE_CODES[letters]
    if len(letters) <= 2 and (mark or post):
        if mark in _ACCENT and len(letters) == 1:
            return unicodedata.normalize("NFC", letters + _ACCENT[mark])
        return letters  # breve, macron, dot and other pronunciation marks: the bare letter
    return m.group(0)  # not a character code: an editorial insertion such as [They]


def _gcide_inline(text):
    text = _LABEL.sub(lambda m: "(" + GCIDE_LABELS[m.group(1)] + ")", text)
    text = _CODE.sub(_gcide_code, text)
    text = text.replace("{", "").replace("}", "")
    text = re.sub(r"\s--(?=[A-Z])[^\n]*", "", text)  # citations: "--Shak.", "--Acts xvi. 29."
    text = text.replace("\\", "")
    return text


def _strip_brackets(s):
    out, depth = [], 0
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def gcide_entry(raw):
    """One dictd entry -> (headword, pos, domain, [paragraphs]) or None."""
    lines = raw.rstrip("\n").split("\n")
    m = re.match(r"^([^\\\n]+?) \\", lines[0])
    if not m:
        return None
    head = m.group(1).strip()
    depth, end = 0, 0
    for i, line in enumerate(lines):
        depth += line.count("[") - line.count("]")
        end = i
        if depth <= 0:
            break
    header = " ".join(lines[:end + 1])
    body = lines[end + 1:]
    rest = re.sub(r"\\[^\\]*\\", "", header[len(m.group(1)):])
    rest = _strip_brackets(rest)
    domain = None
    dm = re.search(r"\(([A-Z][A-Za-z]*\.(?: [A-Za-z]+\.?)*|[A-Z][a-z]+)\)", rest)
    if dm:
        domain = dm.group(1)
    rest = re.sub(r"\([^()]*\)", "", rest)
    pos = None
    for piece in rest.split(","):
        p = re.sub(r"\s+", " ", piece).strip()
        if p in GCIDE_POS:
            pos = GCIDE_POS[p]
            break
    # Body: drop source tags and quotations (indented 12+), then group into paragraphs.
    paras, cur = [], []
    for line in body:
        if _SOURCE_TAG.match(line):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        if indent >= 12:
            continue
        stripped = line.strip()
        # A new sense or sub-sense starts a paragraph even without a blank line before it.
        if cur and re.match(r"^(\d+\.|\([a-z]\)|Syn:|Note:|Usage:)", stripped) and indent <= 6:
            paras.append(" ".join(cur))
            cur = []
        cur.append(stripped)
    if cur:
        paras.append(" ".join(cur))
    out = []
    for p in paras:
        p = unwrap(_gcide_inline(p))
        p = re.sub(r"(?<=[A-Za-z])[`\"*](?=[A-Za-z])", "", p)  # syllable marks of run-on derivatives
        p = re.sub(r"\s*--\s*$", "", p)
        if not p or re.search(r"(?:^|[\s(])\?(?=[\s,;.)]|$)", p):
            continue  # a lone "?" stands for a lost Greek or Hebrew character
        if p.startswith("Syn:"):
            p = "Synonyms:" + p[4:]
        out.append(p)
    if not out:
        return None
    return head, pos, domain, out


def gcide_docs(root):
    base = os.path.join(root, "usr/share/dictd/gcide")
    if not os.path.exists(base + ".index"):
        raise SystemExit(f"make_corpus.py: {base}.index missing (run tools/train/fetch_sources.sh)")
    with gzip.open(base + ".dict.dz", "rb") as f:  # dictzip is gzip with a random-access table
        data = f.read()
    ranges = set()
    with open(base + ".index", encoding="utf-8") as f:
        for line in f:
            word, off, length = line.rstrip("\n").split("\t")
            if not word.startswith("00-"):
                ranges.add((_b64(off), _b64(length)))
    docs, seen_head = [], collections.Counter()
    for off, length in sorted(ranges):
        raw = data[off:off + length].decode("utf-8", errors="replace")
        parsed = gcide_entry(raw)
        if not parsed:
            continue
        head, pos, domain, paras = parsed
        if not re.search(r"[A-Za-z]", head):
            continue
        label = head + (f" ({pos})" if pos else "")
        senses = [p for p in paras if re.match(r"^\d+\. ", p)]
        if len(paras) == 1:
            text = f"{label}: {paras[0]}\n"
        else:
            text = f"{label}:\n" + "".join(p + "\n" for p in paras)
        if domain and domain not in text.split("\n")[0]:
            text = text.replace(":", f" ({domain}):", 1)
        seen_head[head] += 1
        first = paras[0] if not senses else senses[0]
        first = re.sub(r"^\d+\. ", "", first)
        docs.append(Doc("gcide", f"{head}#{seen_head[head]}", text,
                        {"head": head, "pos": pos, "first": first, "n_senses": len(senses)}))
    return docs


# ---------------------------------------------------------------------------------------------------------
# Python documentation (info)

PY_SKIP_CHAPTERS = {1, 13, 14, 15, 16, 17, 18}  # What's New; about, bugs, copyright, licence; legacy distutils
_NOTE = re.compile(r"\*[Nn]ote[ \n]+(?P<label>[^:]{1,80}?)::|\*[Nn]ote[ \n]+(?P<label2>[^:]{1,80}?):[ \n]+"
                   r"(?P<target>[^\n.,]+?)(?P<p>[.,])")
_HEADING = re.compile(r"^(\d+(?:\.\d+)*) (\S.*)\n([*=\-.])\3{2,}\n", re.M)
_DEFLINE = re.compile(r"^ -- (Function|Method|Class|Data|Attribute|Exception|C Function|C Member|C Type|"
                      r"C Variable|C Macro|C Struct|Opcode|Program Option|Environment Variable|Pdbcommand|"
                      r"Describe|Object): (.*)$", re.M)


def _py_note(m):
    """"*note LABEL: TARGET." -> LABEL. The "." or "," closing the reference is info syntax, but where the
    reference ended a sentence it stood for the full stop too: kept before two spaces and a capital, a blank
    line or the end; a "," is kept (it is always also the sentence's comma)."""
    if m.group("label") is not None:
        return unwrap(m.group("label"))
    label, rest = unwrap(m.group("label2")), m.string[m.end():m.end() + 3]
    if m.group("p") == ",":
        return label + ","
    if re.match(r"  [A-Z]|\n\n|\n?$", rest):
        return label + "."
    return label


def python_clean(body):
    for marker in ("\n* Menu:", "\n   ---------- Footnotes ----------"):
        cut = body.find(marker)
        if cut >= 0:
            body = body[:cut]
    body = _NOTE.sub(_py_note, body)
    body = re.sub(r"(?<=[A-Za-z0-9_)\]'’”])\((\d{1,2})\)(?=[\s.,;:)]|$)", "", body)  # footnote markers
    body = _DEFLINE.sub(lambda m: f"{m.group(1)}: {re.sub(r' [(]', '(', m.group(2))}", body)
    # Section underlines go; the heading line stays.
    body = re.sub(r"^(\d+(?:\.\d+)* \S.*)\n[*=\-.]{3,}$", r"\1", body, flags=re.M)
    return body


def python_docs(root):
    path = os.path.join(root, "usr/share/info/python3.11.info.gz")
    if not os.path.exists(path):
        raise SystemExit(f"make_corpus.py: {path} missing (run tools/train/fetch_sources.sh)")
    with gzip.open(path, "rb") as f:
        info = f.read().decode("utf-8")
    docs, chapter, seen = [], 0, collections.Counter()
    for chunk in info.split("\x1f\n")[1:]:
        head, _, body = chunk.partition("\n")
        m = re.match(r"^File: [^,]+,  Node: (.+?)(?:,  (?:Next|Prev|Up):.*)?$", head)
        if not m:
            continue  # the tag table
        node = m.group(1)
        h = _HEADING.search(body)
        if h:
            chapter = int(h.group(1).split(".")[0])
        if node in ("Top", "Index", "Python Module Index") or chapter in PY_SKIP_CHAPTERS or chapter == 0:
            continue
        raw_defs = []
        for dm in re.finditer(r"^ -- (Function|Method|Class|Data|Attribute|Exception): (.*)\n\n((?:     .*\n|\n)+)",
                              body, re.M):
            raw_defs.append((dm.group(1), dm.group(2), dm.group(3)))
        text = python_clean(body)
        if len(text.strip()) < 40:
            continue
        defs = []
        for kind, sig, desc in raw_defs:
            desc = python_clean(desc.split("\n\n")[0] if desc.strip() else "")
            defs.append((kind, re.sub(r" \(", "(", sig.strip()), unwrap(desc)))
        title = h.group(2).strip() if h else node
        seen[node] += 1
        meta = {"title": title, "defs": defs, "chapter": chapter}
        if chapter == 12:  # the glossary: "term\n     definition"
            meta["glossary"] = [(t.strip(), unwrap(python_clean(d)))
                                for t, d in re.findall(r"^(\S[^\n]*)\n((?:     [^\n]*\n)+)", body, re.M)]
        docs.append(Doc("python", f"{node}#{seen[node]}", text, meta))
    return docs


# ---------------------------------------------------------------------------------------------------------
# Man pages

GROFF = ["groff", "-k", "-t", "-man", "-Tutf8", "-rLL=78n", "-rHY=0", "-rcR=1", "-P-cbou"]


def render_man(source):
    r = subprocess.run(GROFF, input=b".ad l\n" + source, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    if r.returncode != 0:
        return None
    lines = r.stdout.decode("utf-8", errors="replace").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) < 4:
        return None
    lines = lines[1:-1]  # the running header and footer
    text = "\n".join(lines)
    text = re.sub(r"(?<=[.!?:)])  (?=\S)", " ", text)  # groff's two spaces after a sentence
    return text


def man_docs(root):
    pages = []
    for d in sorted(glob.glob(os.path.join(root, "usr/share/man/man[1-8]"))):
        for path in sorted(glob.glob(os.path.join(d, "*.gz"))):
            if os.path.islink(path):
                continue
            with gzip.open(path, "rb") as f:
                src = f.read()
            if re.match(rb"^(\.\\\".*\n)*\.so ", src):
                continue  # a redirection to another page
            pages.append((os.path.basename(path)[:-3], src))
    if not pages:
        raise SystemExit("make_corpus.py: no man pages under usr/share/man (run tools/train/fetch_sources.sh)")
    docs = []
    for name, src in pages:
        text = render_man(src)
        if not text:
            print(f"make_corpus.py: groff failed on {name}, skipped", file=sys.stderr)
            continue
        section = name.rsplit(".", 1)[-1]
        nm = re.search(r"^NAME\n((?:[ ]{7}.*\n)+)", text + "\n", re.M)
        name_line = unwrap(nm.group(1)) if nm else ""
        docs.append(Doc("man", name, text, {"page": name.rsplit(".", 1)[0], "section": section,
                                            "name_line": name_line}))
    return docs


# ---------------------------------------------------------------------------------------------------------
# Fortunes

FORTUNE_SKIP = {"ascii-art", "ethnic", "men-women", "drugs", "politics", "translate-me", "knghtbrd"}
PROFANITY = re.compile(r"\b(fuck\w*|shit\w*|cunt\w*|bitch\w*|bastard\w*|whore\w*|slut\w*|nigg\w*|fag\w*|"
                       r"rape\w*|porn\w*|dick|cock\w*|pussy|tits?|asshole\w*|sex\w*|nazi\w*|penis\w*|"
                       r"vagina\w*|orgasm\w*|viagra|cocaine|heroin|marijuana|suicide\w*|god ?damn\w*)\b", re.I)


def fortune_docs(root):
    base = os.path.join(root, "usr/share/games/fortunes")
    files = sorted(f for f in os.listdir(base) if "." not in f and not os.path.islink(os.path.join(base, f)))
    if not files:
        raise SystemExit(f"make_corpus.py: no fortune files in {base} (run tools/train/fetch_sources.sh)")
    docs = []
    for name in files:
        if name in FORTUNE_SKIP:
            continue
        with open(os.path.join(base, name), "rb") as f:
            raw = f.read().decode("utf-8", errors="replace")
        raw = re.sub(r".\x08", "", raw)  # overstrike (underline and bold) sequences
        for i, entry in enumerate(re.split(r"(?m)^%\n", raw)):
            if not entry.strip() or PROFANITY.search(entry):
                continue
            # Right-aligned attributions ("\t\t-- Mark Twain") keep four spaces of indentation.
            entry = re.sub(r"(?m)^[ \t]{5,}(?=--)", "    ", entry.expandtabs(8))
            docs.append(Doc("fortunes", f"{name}#{i}", entry, {"file": name}))
    return docs


# ---------------------------------------------------------------------------------------------------------
# Chat pairs


def article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


IDENTITY = [
    (["Hello!", "Hi!", "Hello", "Hi there.", "Good morning!", "Hey."],
     ["Hello! I am Magnetar's demo model. Ask me what a word means, for a Bible verse, for a fortune, or "
      "about Python and Linux.",
      "Hi! I am a small demo model. I can define words, quote the King James Bible and tell fortunes."]),
    (["Who are you?", "What are you?", "What is your name?", "Introduce yourself."],
     ["I am the Magnetar demo model: a small mixture-of-experts language model trained on free texts from "
      "Debian: the King James Bible, an old English dictionary, the Python documentation, Linux manual pages "
      "and fortune cookies.",
      "I am a tiny language model made to show Magnetar running a mixture-of-experts model. I know a little "
      "about words, the Bible, Python and Linux."]),
    (["What can you do?", "How can you help me?", "What do you know?"],
     ["I can tell you what a word means, quote a verse of the King James Bible, tell you a fortune, and say "
      "what a Python function or a Linux command is for. I am small, so check what I say.",
      "Ask me to define a word, to quote a Bible verse, to tell a fortune, or what a Python function does."]),
    (["Thank you!", "Thanks.", "Thanks a lot!"], ["You are welcome.", "Glad to help."]),
    (["Goodbye.", "Bye!", "See you later."], ["Goodbye!", "Goodbye, and good luck."]),
    (["How are you?", "How are you today?"],
     ["I am a language model, so I have no feelings, but I am ready to help.", "Very well, thank you. "
      "What would you like to know?"]),
    (["What is Magnetar?", "Tell me about Magnetar."],
     ["Magnetar is an inference engine for large mixture-of-experts language models. It keeps the parts of "
      "the model that decide things in memory and streams the experts from disk.",
      "Magnetar runs mixture-of-experts language models, even ones far larger than the memory of the machine."]),
    (["What is a mixture of experts?", "What is a mixture-of-experts model?"],
     ["A mixture-of-experts model has many small feed-forward networks, the experts, in each layer. A router "
      "picks a few of them for every token, so only part of the model works on each token.",
      "It is a neural network whose layers hold many experts; for each token a router chooses a few of them."]),
]


def chat_pairs(docs, rng):
    """(source, user, assistant) pairs made from DOCS (already one split), in a deterministic order."""
    pairs = []
    add = lambda src, u, a: pairs.append((src, u.strip(), a.strip()))
    by_source = collections.defaultdict(list)
    for d in docs:
        by_source[d.source].append(d)

    # Dictionary definitions: the first sense of each headword's first entry.
    seen = set()
    for d in by_source["gcide"]:
        head, pos, first = d.meta["head"], d.meta["pos"], d.meta["first"]
        word = head.lower() if head[:1].isupper() and head[1:].islower() else head
        if word in seen or not re.fullmatch(r"[A-Za-z][A-Za-z' -]{1,30}", word):
            continue
        if len(first) < 12 or re.match(r"^(See|Same as|Alt\. of|Alt\. spelling|pl\. of|imp\. of|p\. p\.)", first):
            continue
        seen.add(word)
        answer = first_sentences(first, 300)
        label = f"{head} ({pos})" if pos else head
        q = rng.choice([f"What does the word \"{word}\" mean?", f"Define {word}.", f"What is the meaning of "
                        f"\"{word}\"?", f"What does {word} mean?", f"Give me the definition of {word}.",
                        f"What is {article(word)} {word}?" if pos == "noun" else f"Define the word {word}."])
        add("gcide", q, f"{label}: {answer}")

    # Bible verses and chapter counts.
    for d in by_source["kjv"]:
        book, chapter = d.meta["book"], d.meta["chapter"]
        for verse, text in d.meta["verses"]:
            if len(text) > 320:
                continue
            ref = f"{book} {chapter}:{verse}"
            q = rng.choice([f"Quote {ref}.", f"What does {ref} say?", f"Recite {ref}.",
                            f"What is written in {ref}?", f"{ref}?", f"Read me {ref} from the King James Bible."])
            add("kjv", q, f"{ref}: {text}")
        if chapter == 1:
            add("kjv", f"What is the first verse of {book}?", f"{book} 1:1: {d.meta['verses'][0][1]}")

    # Fortunes.
    topics = {"computers": "computers", "science": "science", "food": "food", "work": "work", "linux": "Linux",
              "startrek": "Star Trek", "sports": "sports", "pets": "pets", "education": "education",
              "law": "the law", "medicine": "medicine", "literature": "literature", "art": "art", "love": "love",
              "wisdom": "wisdom", "kids": "children", "debian": "Debian", "perl": "Perl", "magic": "magic"}
    for d in by_source["fortunes"]:
        text = d.text.strip("\n")
        if len(text) > 400 or len(text) < 10:
            continue
        f = d.meta["file"]
        generic = ["Tell me a fortune.", "Give me a fortune cookie.", "Say something wise.", "Give me a quote.",
                   "Tell me something interesting.", "I need a fortune.", "Fortune, please."]
        if f == "riddles":
            q = rng.choice(["Tell me a riddle.", "Do you know a riddle?"])
        elif f in ("humorists", "miscellaneous", "zippy", "platitudes", "paradoxum"):
            q = rng.choice(generic + ["Tell me something funny.", "Make me smile."])
        elif f in topics and rng.random() < 0.5:
            q = rng.choice([f"Tell me a fortune about {topics[f]}.", f"Give me a quote about {topics[f]}."])
        else:
            q = rng.choice(generic)
        add("fortunes", q, text)

    # Python: what functions, classes, methods and modules are for; the glossary.
    for d in by_source["python"]:
        title = d.meta["title"]
        mm = re.match(r"^'?([a-z_][\w.]*)'? — (.+)$", title)
        if mm:
            mod, purpose = mm.group(1), mm.group(2).strip().rstrip(".")
            q = rng.choice([f"What is the Python module {mod} for?", f"What does the {mod} module do?",
                            f"What is {mod} in Python?"])
            add("python", q, f"The {mod} module: {purpose[:1].lower() + purpose[1:]}.")
        for kind, sig, desc in d.meta["defs"]:
            if len(desc) < 15 or desc.startswith(("These functions are described", "See ", "Alias", "Parameters:")):
                continue
            name = sig.split("(")[0].strip()
            answer = first_sentences(desc, 350)
            if answer.endswith(":"):  # "Some examples:" announcing what is not there
                answer = answer[:len(answer) - len(re.split(r"(?<=[.!?]) ", answer)[-1])].strip()
            if len(answer) < 15:
                continue
            if kind in ("Function", "Method"):
                q = rng.choice([f"What does {name}() do in Python?", f"In Python, what does {name} do?",
                                f"Explain the Python {kind.lower()} {name}."])
            elif kind == "Class":
                q = rng.choice([f"What is the Python class {name}?", f"What is {name} in Python?"])
            elif kind == "Exception":
                q = rng.choice([f"When is {name} raised in Python?", f"What is the Python exception {name}?"])
            else:
                q = rng.choice([f"What is {name} in Python?", f"What does the Python {kind.lower()} {name} hold?"])
            add("python", q, f"{sig}: {answer}")
        for term, definition in d.meta.get("glossary", []):
            if 2 <= len(term) <= 40 and len(definition) >= 15:
                add("python", rng.choice([f"In Python, what is {term}?", f"What does \"{term}\" mean in Python?"]),
                    f"{term}: {first_sentences(definition, 350)}")

    # Man pages: the NAME line.
    kinds = {"1": "the command", "2": "the system call", "3": "the C library function", "4": "the device",
             "5": "the file format", "6": "the game", "7": "the overview page", "8": "the administration command"}
    for d in by_source["man"]:
        m = re.match(r"^(.+?) - (.+)$", d.meta["name_line"])
        if not m:
            continue
        page, section = d.meta["page"], d.meta["section"][:1]
        what = kinds.get(section, "the manual page")
        call = f"{page}()" if section in "23" else page
        q = rng.choice([f"What does {call} do?", f"What is {what} {page}?", f"What is {page}({section}) for?",
                        f"Explain {what} {page}."])
        add("man", q, f"{page}({section}): {m.group(2).strip()}.")
    return pairs


def synthetic_pairs(rng):
    pairs = []
    for questions, answers in IDENTITY:
        for q in questions:
            for rep in range(12):
                pairs.append(("synthetic", q, answers[rep % len(answers)]))
    words = "zero one two three four five six seven eight nine ten eleven twelve".split()
    for a in range(0, 21):
        for b in range(0, 21):
            qa = rng.choice([f"What is {a} plus {b}?", f"What is {a} + {b}?", f"Add {a} and {b}."])
            pairs.append(("synthetic", qa, f"{a} plus {b} is {a + b}."))
            if a <= 12 and b <= 12:
                qm = rng.choice([f"What is {a} times {b}?", f"What is {a} * {b}?", f"Multiply {a} by {b}."])
                pairs.append(("synthetic", qm, f"{a} times {b} is {a * b}."))
            if a >= b:
                pairs.append(("synthetic", f"What is {a} minus {b}?", f"{a} minus {b} is {a - b}."))
    for i, w in enumerate(words):
        pairs.append(("synthetic", f"How do you write {i} in words?", f"{i} is written \"{w}\"."))
    return pairs


# ---------------------------------------------------------------------------------------------------------
# Packages, licences, outputs


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_info(debs_dir, root):
    out = {}
    for deb in sorted(glob.glob(os.path.join(debs_dir, "debs", "*.deb"))):
        fields = subprocess.run(["dpkg-deb", "-f", deb, "Package", "Version"], check=True, capture_output=True,
                                text=True).stdout
        kv = dict(line.split(": ", 1) for line in fields.strip().split("\n"))
        pkg = kv["Package"]
        copyright_path = os.path.join(root, "usr/share/doc", pkg, "copyright")
        licences = []
        if os.path.exists(copyright_path):
            with open(copyright_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if text.startswith("Format:"):  # machine-readable (DEP-5): its License fields
                licences = sorted(set(m.strip() for m in re.findall(r"^License: *(\S.*)$", text, re.M)))
            else:  # free text: name the licences it states
                for pat, name in ((r"GNU General Public License.{0,80}version 2|GPL version 2 or later", "GPL-2+"),
                                  (r"PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2", "PSF-2.0"),
                                  (r"Redistribution and use in source and binary forms", "BSD"),
                                  (r"copyright for the King James Version.{0,40}expired", "public domain (KJV text)"),
                                  (r"Zero-Clause BSD", "0BSD")):
                    if re.search(pat, text, re.S | re.I):
                        licences.append(name)
        out[pkg] = {
            "version": kv["Version"],
            "deb": os.path.basename(deb),
            "deb_sha256": sha256_file(deb),
            "copyright_file": f"/usr/share/doc/{pkg}/copyright",
            "copyright_sha256": sha256_file(copyright_path) if os.path.exists(copyright_path) else None,
            "licences_named_in_copyright": licences,
            "licence_summary": LICENCE_SUMMARY.get(pkg, ""),
        }
        if pkg in TOOL_PACKAGES:
            out[pkg]["role"] = TOOL_PACKAGES[pkg]
    return out


def file_stats(path):
    with open(path, "rb") as f:
        data = f.read()
    return {"bytes": len(data), "lines": data.count(b"\n"), "sha256": hashlib.sha256(data).hexdigest()}


def write_tar_gz(path, members):
    """Deterministic .tar.gz of (arcname, path) members: fixed mtime, owner and mode, gzip mtime 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for arcname, src in members:
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    with open(path + ".tmp", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            gz.write(buf.getvalue())
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--debs", default="build/corpus-debs", help="fetch_sources.sh's folder")
    ap.add_argument("--out", default="build/corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sources", default="kjv,gcide,python,man,fortunes",
                    help="comma-separated subset, for testing (the manifest records it)")
    args = ap.parse_args()
    root = os.path.join(args.debs, "root")
    if not os.path.isdir(root):
        raise SystemExit(f"make_corpus.py: {root} missing: run tools/train/fetch_sources.sh first")
    os.makedirs(args.out, exist_ok=True)
    builders = {"kjv": kjv_docs, "gcide": gcide_docs, "python": python_docs, "man": man_docs,
                "fortunes": fortune_docs}
    sources = [s for s in args.sources.split(",") if s]
    for s in sources:
        if s not in builders:
            raise SystemExit(f"make_corpus.py: --sources: unknown source '{s}' (known: {', '.join(builders)})")

    docs, per_source = [], collections.OrderedDict()
    seen_hashes = set()
    for s in sources:
        raw_docs = builders[s](root)
        kept = dupes = empty = 0
        for d in raw_docs:
            d.text = normalise(d.text)
            if EOT in d.text:
                d.text = d.text.replace(EOT, "")
            if not d.text:
                empty += 1
                continue
            h = hashlib.sha256(d.text.encode("utf-8")).digest()
            if h in seen_hashes:
                dupes += 1
                continue
            seen_hashes.add(h)
            docs.append(d)
            kept += 1
        per_source[s] = {"documents_read": len(raw_docs), "duplicates_dropped": dupes, "empty_dropped": empty,
                         "packages": SOURCE_PACKAGES[s]}
        print(f"make_corpus.py: {s}: {kept} documents ({dupes} duplicates, {empty} empty dropped)", file=sys.stderr)

    train = [d for d in docs if not is_heldout(d.source, d.key)]
    heldout = [d for d in docs if is_heldout(d.source, d.key)]
    rng = random.Random(args.seed)
    order_train, order_held = list(train), list(heldout)
    rng.shuffle(order_train)
    rng.shuffle(order_held)
    paths = {name: os.path.join(args.out, name) for name in
             ("train.txt", "heldout.txt", "chat.jsonl", "chat_heldout.jsonl", "manifest.json")}
    for name, split in (("train.txt", order_train), ("heldout.txt", order_held)):
        with open(paths[name], "w", encoding="utf-8", newline="\n") as f:
            for d in split:
                f.write(d.text)
                f.write(EOT + "\n")

    for s in per_source:
        for split_name, split in (("train", train), ("heldout", heldout)):
            sel = [d for d in split if d.source == s]
            b = sum(len(d.text.encode("utf-8")) for d in sel)
            per_source[s][split_name] = {"documents": len(sel), "bytes": b,
                                         "lines": sum(d.text.count("\n") for d in sel)}

    # Chat pairs: train documents -> chat.jsonl, held-out documents -> chat_heldout.jsonl.
    chat_train = chat_pairs(train, random.Random(args.seed + 1)) + synthetic_pairs(random.Random(args.seed + 2))
    chat_held = chat_pairs(heldout, random.Random(args.seed + 3))
    caps = {"gcide": 40000, "kjv": 16000}
    rng_cap = random.Random(args.seed + 4)
    by_src = collections.defaultdict(list)
    for p in chat_train:
        by_src[p[0]].append(p)
    chat_train = []
    for s in sorted(by_src):
        items = by_src[s]
        if s in caps and len(items) > caps[s]:
            items = sorted(rng_cap.sample(range(len(items)), caps[s]))
            items = [by_src[s][i] for i in items]
        chat_train.extend(items)
    rng_cap.shuffle(chat_train)
    rng_cap.shuffle(chat_held)
    chat_held = chat_held[:2000]
    for name, pairs in (("chat.jsonl", chat_train), ("chat_heldout.jsonl", chat_held)):
        with open(paths[name], "w", encoding="utf-8", newline="\n") as f:
            for src, u, a in pairs:
                f.write(json.dumps({"source": src, "user": normalise(u).strip(), "assistant": normalise(a).strip()},
                                   ensure_ascii=False) + "\n")

    packages = package_info(args.debs, root)
    manifest = {
        "what": "Magnetar demo-model corpus (tools/train/make_corpus.py)",
        "settings": {"seed": args.seed, "heldout_per_10000_documents": HELDOUT_PER_10K, "sources": sources,
                     "document_separator": EOT + "\\n", "fortune_files_skipped": sorted(FORTUNE_SKIP),
                     "python_info_chapters_skipped": sorted(PY_SKIP_CHAPTERS), "groff": " ".join(GROFF)},
        "packages": packages,
        "sources": per_source,
        "chat_pairs": {"train": dict(sorted(collections.Counter(p[0] for p in chat_train).items())),
                       "heldout": dict(sorted(collections.Counter(p[0] for p in chat_held).items()))},
        "files": {name: file_stats(paths[name]) for name in ("train.txt", "heldout.txt", "chat.jsonl",
                                                              "chat_heldout.jsonl")},
    }
    with open(paths["manifest.json"], "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    write_tar_gz(os.path.join(args.out, "pretrain.tar.gz"),
                 [("train.txt", paths["train.txt"]), ("heldout.txt", paths["heldout.txt"])])
    write_tar_gz(os.path.join(args.out, "chat.tar.gz"),
                 [("chat.jsonl", paths["chat.jsonl"]), ("chat_heldout.jsonl", paths["chat_heldout.jsonl"]),
                  ("manifest.json", paths["manifest.json"])])
    for name in ("train.txt", "heldout.txt", "chat.jsonl", "chat_heldout.jsonl", "pretrain.tar.gz", "chat.tar.gz"):
        st = os.stat(os.path.join(args.out, name))
        print(f"make_corpus.py: {name}: {st.st_size / 1e6:.2f} MB", file=sys.stderr)
    print(f"make_corpus.py: chat pairs: {len(chat_train)} train, {len(chat_held)} held out", file=sys.stderr)


if __name__ == "__main__":
    main()
