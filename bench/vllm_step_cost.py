#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What kvferry's vLLM connector adds to a decode step's host time, on
vLLM's CPU engine serving a tiny random-initialised Llama (the engine
tests' model): per workload (a small batch decoding long, a large batch),
engines without the connector (A) and with it (B) started alternately,
A B B A A B ..., --rounds pairs, one process each (python/tests/
vllm_engine_main.py's timing scenarios). Each round times every engine
step: the step thread's wall and CPU time (CPU time counts only what the
thread ran, so other work on a shared machine inflates it far less than
wall). Per round the median over its decode steps; per workload the
median and spread over rounds, the added time (each pair's B - A, their
median) as a share of the step, and a line saying when the pairs'
differences spread wider than the 2 % target (the machine's drift then
hides what is measured). One more kvferry round per workload times
the connector's hooks themselves (both sides, every call, the timers' own
cost subtracted): their time per step as a share of the step. The
machine's load is printed before and after every round.

    KVFERRY_LIBRARY=build/libkvferry.so PYTHONPATH=python \\
        ~/.cache/kvferry/vllm-venv/bin/python bench/vllm_step_cost.py --rounds 3 --out FILE.jsonl
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.join(HERE, "..", "python", "tests", "vllm_engine_main.py")
TARGET = 0.02  # the connector may add this share of a decode step


def one(tmp, scenario, batch, tokens, hooks=False):
    # one OpenMP thread, as vLLM's CPU worker sets torch's: with the
    # default, a process ran 1 ms steps at 150 ms for seconds, its thread
    # CPU half of that (most likely OpenMP threads spinning while another
    # process held the core their partner needed)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    kv = tempfile.mkdtemp(prefix="kv-", dir=tmp)  # a fresh cache every round
    args = [sys.executable, MAIN, os.path.join(tmp, "model"), scenario, kv, f"batch={batch}", f"tokens={tokens}"]
    if hooks:
        args.append("hooks=1")
    load0 = os.getloadavg()[0]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit(f"{scenario}: exit {p.returncode}\n{p.stderr[-4000:]}")
    r = json.loads(lines[-1][len("RESULT "):])
    r["load_before"], r["load_after"] = load0, os.getloadavg()[0]
    return r


def med(xs):
    return statistics.median(xs)


def spread(xs):
    """(max - min) / median: how far rounds of one engine disagree."""
    return (max(xs) - min(xs)) / med(xs) if len(xs) > 1 else 0.0


def row(r):
    w, c = r["step_wall_s"], r["step_cpu_s"]
    return med(w), med(c)


def report(name, pairs, hooked):
    print(f"== {name}")
    a = [row(x) for x, _ in pairs]
    b = [row(y) for _, y in pairs]
    verdicts = []
    for i, what in ((0, "wall"), (1, "thread CPU")):
        off, on = [x[i] for x in a], [x[i] for x in b]
        added = [y - x for x, y in zip(off, on)]
        share = med(added) / med(off)
        print(f"step {what} without kvferry, us: {med(off) * 1e6:.1f} (rounds {', '.join(f'{x * 1e6:.1f}' for x in off)};"
              f" spread {spread(off) * 100:.1f} %)")
        print(f"step {what} with kvferry, us:    {med(on) * 1e6:.1f} (rounds {', '.join(f'{x * 1e6:.1f}' for x in on)};"
              f" spread {spread(on) * 100:.1f} %)")
        print(f"added per step ({what}), us: {med(added) * 1e6:+.1f} = {share * 100:+.2f} % of the step "
              f"(pairs {', '.join(f'{x * 1e6:+.1f}' for x in added)})")
        # the pairs' differences must agree within the target: else the
        # machine's drift between two processes is as large as what is
        # measured
        wide = (max(added) - min(added)) / med(off) if len(added) > 1 else float("inf")
        if wide > TARGET:
            print(f"  NOT TRUSTED: the pairs' differences spread over {wide * 100:.1f} % of the step, wider than the "
                  f"{TARGET * 100:.0f} % being measured (rerun when the machine is quieter, or with more --rounds)")
            verdicts.append(None)
        else:
            verdicts.append(share < TARGET)
    h = hooked
    hooks = h["hooks_s"]
    per_step = sum(hooks) / len(hooks)
    step = med(h["step_wall_s"])
    print(f"connector hooks (a timed kvferry round, {h['steps']} steps, timer cost {h['timer_cost_s'] * 1e9:.0f} ns "
          f"a call subtracted): {per_step * 1e6:.1f} us per step on average (median step {med(hooks) * 1e6:.1f}, "
          f"most {max(hooks) * 1e6:.1f}) = {per_step / step * 100:.2f} % of that round's median step "
          f"({step * 1e6:.1f} us)")
    print("  per hook, us/step: " + ", ".join(f"{k} {v * 1e6:.2f}" for k, v in h["per_hook_s_per_step"].items()))
    print("  calls per step: " + ", ".join(f"{k} {v:.2f}" for k, v in h["calls_per_step"].items()))
    hook_ok = per_step / step < TARGET
    return verdicts, hook_ok


def compact(r):
    """A round with its per-step times to 0.1 us (the file stays small)."""
    return {k: [round(x, 7) for x in v] if k in ("step_wall_s", "step_cpu_s", "hooks_s") else v for k, v in r.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="A/B pairs per workload")
    ap.add_argument("--workloads", default="4x512,64x256", help="BATCHxTOKENS, comma-separated")
    ap.add_argument("--out", help="write every round here (JSON lines)")
    args = ap.parse_args()
    workloads = [tuple(int(v) for v in w.split("x")) for w in args.workloads.split(",")]
    rows, results = [], {}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, "
          f"load {os.getloadavg()[0]:.2f} at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvf-step-") as tmp:
        for batch, tokens in workloads:
            pairs = []
            for i in range(args.rounds):
                pair = {}
                # A B, then B A: whatever favours the first or the second
                # process of a pair (a drifting load, warm files) falls on
                # each side equally
                order = ("timing-plain", "timing-kvferry")
                for scenario in order if i % 2 == 0 else order[::-1]:
                    r = one(tmp, scenario, batch, tokens)
                    r["round"] = i
                    rows.append(r)
                    pair[scenario] = r
                    w, c = row(r)
                    print(f"{batch}x{tokens} round {i} {scenario}: {r['steps']} steps, median step {w * 1e6:.1f} us "
                          f"wall, {c * 1e6:.1f} us thread CPU (load {r['load_before']:.2f} -> {r['load_after']:.2f})",
                          flush=True)
                pairs.append((pair["timing-plain"], pair["timing-kvferry"]))
            h = one(tmp, "timing-kvferry", batch, tokens, hooks=True)
            h["round"] = "hooks"
            rows.append(h)
            print(f"{batch}x{tokens} hooks round: load {h['load_before']:.2f} -> {h['load_after']:.2f}", flush=True)
            results[(batch, tokens)] = (pairs, h)
    print(f"machine: load {os.getloadavg()[0]:.2f} at the end, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for (batch, tokens), (pairs, h) in results.items():
        verdicts, hook_ok = report(f"{batch} sequences decoding {tokens} tokens (64-token prompts)", pairs, h)
        print(f"under {TARGET * 100:.0f} %: hooks {'yes' if hook_ok else 'NO'}; on/off wall "
              f"{'untrusted' if verdicts[0] is None else 'yes' if verdicts[0] else 'NO'}; on/off thread CPU "
              f"{'untrusted' if verdicts[1] is None else 'yes' if verdicts[1] else 'NO'}")
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(compact(r)) + "\n")


if __name__ == "__main__":
    main()
