#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The source tree keeps its layers (docs/architecture.md).

Checks what the compiler alone does not say clearly or at all:
- every library file lives in a layer folder and is built by CMakeLists.txt;
- a file includes headers of its own layer or of the layers below it;
- no two headers share a base name (they are included by base name);
- the CLI's files outside the named internal ones use the public header only;
- comments carry no dates or machine names (figures live in docs/);
- every source file names its licence (an SPDX line at its top);
- code, comments, output and docs use words a user knows: no "the seed",
  "the reference", "reference engine" (say TensorRT-LLM's transfer manager,
  or what is meant) and no issue numbers (bench/results/ keeps the raw
  outputs of earlier runs as they were printed; CHANGELOG.md its history).
Exit 0 when all hold, 1 with one line per breach.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
LAYERS = ["core", "backend", "store", "engine", "cache"]
# CLI files that may reach below the public API (the benchmarks and what
# they share); every other file of tools/ sees include/kvferry.h only.
TOOLS_INTERNAL = {"bench.c", "bench_remote.c"}
DATED = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b|\bH200\b|\bH100\b|\bGH200\b")

breaches = []


def files_under(top, exts):
    for d, _, names in os.walk(os.path.join(ROOT, top)):
        for n in sorted(names):
            if n.endswith(exts):
                yield os.path.relpath(os.path.join(d, n), ROOT)


def layer_of(path):
    parts = path.split(os.sep)
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else None


def comments(text):
    return re.findall(r"/\*.*?\*/|//[^\n]*", text, flags=re.S)


src = list(files_under("src", (".c", ".cu", ".h")))
headers = {}
for h in src + list(files_under("include", (".h",))):
    if h.endswith(".h"):
        headers.setdefault(os.path.basename(h), []).append(h)
for name, paths in headers.items():
    if len(paths) > 1:
        breaches.append(f"headers share the base name {name}: {', '.join(paths)}")

with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    cmake = f.read()
for path in src:
    layer = layer_of(path)
    if layer is None:
        breaches.append(f"{path}: not in a layer folder (src/{{{','.join(LAYERS)}}}/)")
        continue
    if not path.endswith(".h") and path.replace(os.sep, "/") not in cmake:
        breaches.append(f"{path}: not built (name it in its kvf_add_layer call)")
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, flags=re.M):
        base = os.path.basename(inc)
        if base == "kvferry.h":
            continue
        if base not in headers:
            continue  # a third-party header (hiredis, cuFile ...)
        target = layer_of(headers[base][0])
        if target is None:
            continue
        if LAYERS.index(target) > LAYERS.index(layer):
            breaches.append(f"{path}: includes {headers[base][0]} of layer {target}, above {layer}")
    for c in comments(text):
        m = DATED.search(c)
        if m:
            breaches.append(f"{path}: a comment names a date or machine ({m.group(0)}): "
                            "say why, and leave figures to docs/performance.md")

for path in files_under("include", (".h",)):
    with open(os.path.join(ROOT, path)) as f:
        for c in comments(f.read()):
            m = DATED.search(c)
            if m:
                breaches.append(f"{path}: a comment names a date or machine ({m.group(0)})")

private = {n for n, paths in headers.items() if any(p.startswith("src") for p in paths)}
for path in files_under("tools", (".c", ".h")):
    if os.path.basename(path) in TOOLS_INTERNAL:
        continue
    with open(os.path.join(ROOT, path)) as f:
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), flags=re.M):
            if os.path.basename(inc) in private:
                breaches.append(f"{path}: includes the library's private {inc}; "
                                "use include/kvferry.h (or move the code into the bench library)")

SPDX_EXTS = (".c", ".h", ".cu", ".sh", ".py", ".cmake")
for top in ("src", "include", "tools", "tests", "bench", "examples", "python", "scripts", "cmake"):
    for path in files_under(top, SPDX_EXTS):
        if "corpus" in path.split(os.sep):
            continue
        with open(os.path.join(ROOT, path), errors="replace") as f:
            head = f.read(400)
        if "SPDX-License-Identifier: Apache-2.0" not in head:
            breaches.append(f"{path}: no SPDX-License-Identifier line at its top")

# Words a user has never heard of; a phrase may wrap across lines and
# comment leaders, so spaces match any run of blanks, '*', '#', '//' or '"'.
GAP = r'(?:[\s*#"]|//)+'
UNKNOWN_WORDS = re.compile("|".join(p.replace(" ", GAP) for p in [
    r"\b[Tt]he reference\b", r"\b[Rr]eference engine", r"\breference's\b",
    r"\b[Tt]he seed\b(?! nodes?\b)", r"\bseed's\b", r"\b[Ss]eed (?:POSIX|transfer|algorithm|code)\b",
    r"\b[Ii]ssues? #?[0-9]+",
]))
WORD_DIRS = ("src", "include", "tools", "tests", "bench", "docs", "examples", "python", "scripts",
             "cmake", ".ci")
WORD_FILES = ("README.md", "Makefile", "CMakeLists.txt")
WORD_EXTS = (".c", ".h", ".cu", ".sh", ".py", ".cmake", ".md", ".txt", ".toml", ".in", ".yaml")


def word_files():
    for name in WORD_FILES:
        yield name
    for top in WORD_DIRS:
        for path in files_under(top, WORD_EXTS):
            parts = path.split(os.sep)
            if "corpus" in parts or parts[:2] == ["bench", "results"] and not path.endswith(".md"):
                continue
            yield path


for path in word_files():
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        continue
    with open(full, errors="replace") as f:
        text = f.read()
    if path == os.path.join("tests", "check_layers.py"):
        continue  # the words themselves
    for m in UNKNOWN_WORDS.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        words = " ".join(m.group(0).split())
        breaches.append(f"{path}:{line}: '{words}': a user does not know it; name TensorRT-LLM's "
                        "transfer manager where a comparison helps, else say what is meant "
                        "(no issue numbers)")

for b in breaches:
    print(b)
if breaches:
    print(f"check_layers: {len(breaches)} breach(es)")
    sys.exit(1)
print(f"check_layers: {len(src)} library files in {len(LAYERS)} layers, all in place")
