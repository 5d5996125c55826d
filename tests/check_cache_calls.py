#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The cache's files call one way (src/cache/cache_private.h).

The top comment of cache_private.h lists the files of src/cache/ in their
rooms, from the bottom up: records, an entry's lifecycle, batching and
submission, the call front. A file may call the functions of the files
listed before it and its own, never one listed after it, so a call never
comes back up into a room it came from.

Reads the function definitions and the calls in their bodies from the
sources (no compiler needed: the cache's C is plain enough), and checks:
- every .c file of src/cache/ is listed once, and every listed one exists;
- no call goes to a function of a file listed after the caller's.
Exit 0 when all hold, 1 with one line per breach.

  check_cache_calls.py [ROOT] [--measure FUNCTION]

--measure follows every call path from FUNCTION through the cache's own
functions (a path stops at a function already on it) and prints: the
functions and files it reaches, the calls that cross into another file,
and of those the returns, calls into a file that the path had left
earlier (a loop between files), per file.
"""
import collections
import os
import re
import sys

args = sys.argv[1:]
measure = None
if "--measure" in args:
    i = args.index("--measure")
    measure = args[i + 1]
    del args[i:i + 2]
ROOT = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
CACHE = os.path.join(ROOT, "src", "cache")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "_Alignof"}


def declared_order():
    with open(os.path.join(CACHE, "cache_private.h")) as f:
        top = f.read().split("#ifndef", 1)[0]  # the comments atop it
    return re.findall(r"^ \*\s+(\w+\.c)\b", top, flags=re.M)


def code_only(text):
    """Comments and string literals blanked (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


DEFINITION = re.compile(
    r"^([A-Za-z_][^;{}()#]*?)\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*"
    r"(?:__attribute__\s*\(\(.*?\)\)\s*)?\{", flags=re.M | re.S)

bodies = {}  # (file, function) -> body text
static = set()
defined_in = collections.defaultdict(list)
files = sorted(n for n in os.listdir(CACHE) if n.endswith(".c"))
for name in files:
    with open(os.path.join(CACHE, name)) as f:
        text = code_only(f.read())
    for m in DEFINITION.finditer(text):
        fn = m.group(2)
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        bodies[(name, fn)] = text[m.end():i]
        defined_in[fn].append(name)
        if re.search(r"\bstatic\b", m.group(1)):
            static.add((name, fn))

calls = {}  # (file, function) -> [(file, function)] in order, one per call site
for (name, fn), body in bodies.items():
    out = []
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", body):
        callee = m.group(1)
        if callee in KEYWORDS or callee not in defined_in:
            continue
        if name in defined_in[callee]:
            out.append((name, callee))
            continue
        shared = [f for f in defined_in[callee] if (f, callee) not in static]
        if len(shared) == 1:
            out.append((shared[0], callee))
    calls[(name, fn)] = out

if measure:
    starts = [k for k in bodies if k[1] == measure]
    if not starts:
        sys.exit(f"check_cache_calls: no function {measure} in src/cache/")
    reached = set()
    todo = list(starts)
    while todo:
        k = todo.pop()
        if k not in reached:
            reached.add(k)
            todo += calls[k]
    entered = 0
    returns = collections.Counter()

    def follow(k, path):
        global entered
        for callee in calls[k]:
            if callee in path:
                continue
            if callee[0] != k[0]:
                entered += 1
                if any(p[0] == callee[0] for p in path):
                    returns[callee[0]] += 1
            follow(callee, path + [callee])

    follow(starts[0], [starts[0]])
    # files that call each other in a loop: those reaching and reached by one another
    edges = collections.defaultdict(set)
    for (name, _), out in calls.items():
        edges[name] |= {f for f, _ in out if f != name}

    def reach(f):
        seen, todo = set(), [f]
        while todo:
            for g in edges[todo.pop()] - seen:
                seen.add(g)
                todo.append(g)
        return seen

    looped = sorted(f for f in files if f in reach(f))
    by_file = ", ".join(f"{f} {n}" for f, n in returns.most_common())
    print(f"{measure}: reaches {len(reached)} functions in {len({f for f, _ in reached})} files; "
          f"{entered} calls into another file, {sum(returns.values())} of them back into a file "
          f"left earlier{': ' + by_file if by_file else ''}")
    print(f"files of src/cache/ calling each other in a loop: {len(looped)} {' '.join(looped)}")
    sys.exit(0)

breaches = []
order = declared_order()
rank = {}
for i, name in enumerate(order):
    if name in rank:
        breaches.append(f"src/cache/cache_private.h: {name} listed twice")
    rank.setdefault(name, i)
for name in files:
    if name not in rank:
        breaches.append(f"src/cache/{name}: not in the list of files atop cache_private.h")
for name in rank:
    if name not in files:
        breaches.append(f"src/cache/cache_private.h: lists {name}, which does not exist")

# a reader that found nothing would pass every file: say so instead
for name in files:
    if not any(f == name for f, _ in bodies):
        breaches.append(f"src/cache/{name}: no function definition found (the reader missed them)")
if not any(f != name for (name, _), out in calls.items() for f, _ in out):
    breaches.append("src/cache/: no call between files found (the reader missed them)")

for (name, fn), out in sorted(calls.items()):
    for callee_file, callee in sorted(set(out)):
        if callee_file == name or name not in rank or callee_file not in rank:
            continue
        if rank[callee_file] > rank[name]:
            breaches.append(f"src/cache/{name}: {fn} calls {callee} of {callee_file}, listed "
                            "after it in cache_private.h: calls run one way (front, batching, "
                            "entries), so move the function down or the caller up")

for b in breaches:
    print(b)
if breaches:
    print(f"check_cache_calls: {len(breaches)} breach(es)")
    sys.exit(1)
print(f"check_cache_calls: {len(files)} files of src/cache call one way")
