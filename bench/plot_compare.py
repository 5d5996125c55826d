#!/usr/bin/env python3
"""Plots `kvferry bench --compare` output: GB/s against block size, one panel
per direction and whole/partial, the ceiling drawn; with --before FILE, an
earlier run's kvferry line too. Usage:
    plot_compare.py [--before earlier.txt] compare.txt out.png [title]"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def parse(path):
    rows, on = [], False
    for line in open(path):
        if line.startswith("kvferry bench --compare:"):
            on = True
            continue
        f = line.split()
        if not on or len(f) < 10 or not f[0].endswith("KiB"):
            continue
        rows.append(dict(kib=int(f[0][:-3]), part=f[1], dir=f[2], ceiling=float(f[3]),
                         ref=float(f[4]), batch=float(f[5]), kvferry=float(f[6])))
    return rows


def main():
    args = sys.argv[1:]
    before = []
    if args and args[0] == "--before":
        before = parse(args[1])
        args = args[2:]
    rows = parse(args[0])
    title = args[2] if len(args) > 2 else "kvferry bench --compare"
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    for i, part in enumerate(["whole", "8/32"]):
        for j, d in enumerate(["d2h", "h2d", "both"]):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["part"] == part and r["dir"] == d),
                         key=lambda r: r["kib"])
            x = [r["kib"] for r in sel]
            ax.plot(x, [r["ceiling"] for r in sel], "k--", label="ceiling (one large copy)")
            ax.plot(x, [r["kvferry"] for r in sel], "o-", lw=2, label="kvferry")
            old = sorted((r for r in before if r["part"] == part and r["dir"] == d),
                         key=lambda r: r["kib"])
            if old:
                ax.plot([r["kib"] for r in old], [r["kvferry"] for r in old], "o:", lw=1,
                        color="gray", label="kvferry before")
            ax.plot(x, [r["batch"] for r in sel], "s-", label="cudaMemcpyBatchAsync")
            ax.plot(x, [r["ref"] for r in sel], "^-", label="reference (one call per block)")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{d}, {'whole blocks' if part == 'whole' else 'first 8 of 32 tokens'}")
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


if __name__ == "__main__":
    main()
