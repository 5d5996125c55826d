#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What kvferry's vLLM connector adds to a decode step: vLLM's CPU engine
(a tiny random-initialised Llama, 4 sequences decoding 256 tokens each)
started without the connector and with it, alternately, --rounds times
each (python/tests/vllm_engine_main.py's timing scenarios, one process per
engine). Per round: the engine's wall and process CPU time per step, and
with kvferry the host time its connector's hooks took per step (every hook
vLLM calls, the scheduler's and the worker's, timed around the call: wall,
and the calling thread's CPU time, which other work on a shared machine
inflates far less). Prints the medians and spread beside each other and
the hooks' share of a step; --out writes the raw rounds as JSON lines.

    KVFERRY_LIBRARY=build/libkvferry.so PYTHONPATH=python \\
        ~/.cache/kvferry/vllm-venv/bin/python bench/vllm_step_cost.py --rounds 3
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


def one(tmp, scenario):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    p = subprocess.run([sys.executable, MAIN, os.path.join(tmp, "model"), scenario, os.path.join(tmp, "kv")],
                       env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit(f"{scenario}: exit {p.returncode}\n{p.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def spread(xs, scale=1e3):
    return f"{statistics.median(xs) * scale:.3f} (min {min(xs) * scale:.3f}, max {max(xs) * scale:.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the raw rounds here (JSON lines)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvf-step-") as tmp:
        for i in range(args.rounds):
            for scenario in ("timing-plain", "timing-kvferry"):
                r = one(tmp, scenario)
                r["round"] = i
                rows.append(r)
                print(f"round {i} {scenario}: {r['steps']} steps, {r['step_s'] * 1e3:.3f} ms/step (cpu "
                      f"{r['step_cpu_s'] * 1e3:.3f}), connector {r['connector_s_per_step'] * 1e6:.1f} us/step "
                      f"(cpu {r['connector_cpu_s_per_step'] * 1e6:.1f})", flush=True)
    plain = [r["step_s"] for r in rows if r["scenario"] == "timing-plain"]
    kvf = [r for r in rows if r["scenario"] == "timing-kvferry"]
    hooks = [r["connector_s_per_step"] for r in kvf]
    share = [r["connector_s_per_step"] / r["step_s"] for r in kvf]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"step without kvferry, ms: {spread(plain)}")
    print(f"step with kvferry, ms:    {spread([r['step_s'] for r in kvf])}")
    print(f"step CPU without kvferry, ms: {spread([r['step_cpu_s'] for r in rows if r['scenario'] == 'timing-plain'])}")
    print(f"step CPU with kvferry, ms:    {spread([r['step_cpu_s'] for r in kvf])}")
    print(f"connector hooks per step, us: {spread(hooks, 1e6)}")
    print(f"connector hooks' thread CPU per step, us: {spread([r['connector_cpu_s_per_step'] for r in kvf], 1e6)}")
    print(f"hooks' share of a step with kvferry (wall), %: {spread(share, 100)}")
    worst = max(kvf, key=lambda r: r["connector_s_per_step"])
    print("per hook, us/step (the round with the most): " +
          ", ".join(f"{k} {v * 1e6:.1f}" for k, v in worst["per_hook_s_per_step"].items()))
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
