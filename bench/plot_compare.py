#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots `kvferry bench --compare` results: GB/s against block size, one panel
per direction and whole/partial, the ceiling drawn; with --before FILE, an
earlier run's kvferry line too. Reads the bench's own JSON lines
(`kvferry bench --compare --json FILE`) or, from older runs, its text table.
`kvferry bench --compare --plot out.png` runs this itself, after asking
it with --check (before the sweep) whether it can draw. Usage:
    plot_compare.py [--before earlier.jsonl|.txt] compare.jsonl|.txt out.png [title]
    plot_compare.py --check      exit 0 where matplotlib imports, 3 (said why) where not"""
import json
import sys

DIRS = {"d2h": "offload_gbs", "h2d": "onboard_gbs", "both": "both_gbs"}


def json_docs(text):
    """The JSON documents of a file: one a line, or (older runs) spread over lines."""
    dec, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return
        doc, at = dec.raw_decode(text, at)
        yield doc


def parse_json(text):
    rows = []
    for run in json_docs(text):
        tokens = run.get("tokens", 0)
        part = "whole" if not tokens else f"{tokens}/{run.get('tokens_per_block', 32)}"
        for d, key in DIRS.items():
            rows.append(dict(kib=run["block_bytes"] // 1024, part=part, dir=d,
                             ceiling=run["ceiling"].get(key, 0),
                             # per_block: "reference" in files written before the rename
                             blk=run.get("per_block", run.get("reference", {})).get(key, 0),
                             batch=run.get("batch", {}).get(key, 0), kvferry=run[key]))
    return rows


def parse_text(lines):
    """The summary table's rows, its columns named by its header line ("ref"
    in tables printed before "blk"; no batch column on the host; "-" where
    nothing was measured)."""
    rows, cols = [], None
    names = {"ref": "blk"}
    for line in lines:
        f = line.split()
        if f[:3] == ["block", "part", "dir"]:
            cols = [names.get(c, c) for c in f]
            continue
        if cols is None or len(f) < 4 or not f[0].endswith("KiB"):
            continue
        cell = dict(zip(cols, f))
        rows.append(dict(kib=int(f[0][:-3]), part=f[1], dir=f[2], ceiling=number(cell, "ceiling"),
                         blk=number(cell, "blk"), batch=number(cell, "batch"),
                         kvferry=number(cell, "kvferry")))
    return rows


def number(cell, col):
    """A table cell as a figure: 0 where the column is absent or says "-"."""
    v = cell.get(col, "-")
    return 0.0 if v == "-" else float(v)


def parse(path):
    text = open(path).read()
    return parse_json(text) if text.lstrip().startswith("{") else parse_text(text.splitlines())


NO_MATPLOTLIB = ("plot_compare.py: matplotlib is not installed for this python3 ({exe}). "
                 "Debian/Ubuntu: apt-get install python3-matplotlib; elsewhere, or without root "
                 "(PEP 668 refuses pip here): python3 -m venv ~/.venv/plot && "
                 "~/.venv/plot/bin/pip install matplotlib, then run with "
                 "PATH=~/.venv/plot/bin:$PATH")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def main():
    args = sys.argv[1:]
    if args == ["--check"]:
        if have_matplotlib():
            return 0
        print(NO_MATPLOTLIB.format(exe=sys.executable), file=sys.stderr)
        return 3
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args and args[0] in ("-h", "--help") else 2
    before = []
    if args[0] == "--before":
        before = parse(args[1])
        args = args[2:]
    rows = parse(args[0])
    if not have_matplotlib():
        print(NO_MATPLOTLIB.format(exe=sys.executable) + "; the figures are in " + args[0],
              file=sys.stderr)
        return 3
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = args[2] if len(args) > 2 else "kvferry bench --compare"
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    parts = sorted({r["part"] for r in rows}, key=lambda p: p != "whole")[:2] or ["whole"]
    for i, part in enumerate(parts + ["8/32"] * (2 - len(parts))):
        for j, d in enumerate(DIRS):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["part"] == part and r["dir"] == d),
                         key=lambda r: r["kib"])
            def line(key, style, label, src=sel, **kw):
                # a figure not measured (0: no ceiling for both at once, no
                # batch copy without a GPU) is left out, not drawn at 0
                pts = [(r["kib"], r[key]) for r in src if r[key] > 0]
                if pts:
                    ax.plot(*zip(*pts), style, label=label, **kw)

            line("ceiling", "k--", "ceiling (one large copy)")
            line("kvferry", "o-", "kvferry", lw=2)
            old = [r for r in before if r["part"] == part and r["dir"] == d]
            line("kvferry", "o:", "kvferry before", src=sorted(old, key=lambda r: r["kib"]),
                 lw=1, color="gray")
            line("batch", "s-", "cudaMemcpyBatchAsync")
            line("blk", "^-", "per-block copy (one call per block)")
            ax.set_xscale("log", base=2)
            what = "whole blocks" if part == "whole" else f"first {part} tokens"
            ax.set_title(f"{d}, {what}")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if i == 1:
                ax.set_xlabel("block size (KiB)")
            if j == 0:
                ax.set_ylabel("GB/s (useful bytes)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args[1], dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main())
