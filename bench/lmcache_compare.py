# SPDX-License-Identifier: Apache-2.0
"""kvferry beside LMCache's own transfer kernel, on vLLM's KV layout.

Moves the same KV between GPU and pinned host memory, both ways, three
ways in one run:

  ceiling   one cudaMemcpy of the same bytes, contiguous on both sides;
  lmcache   LMCache's multi_layer_kv_transfer (its compiled extension
            lmcache.cuda_ops, or c_ops of a release built against an
            older torch, loaded alone from the wheel: nothing else of
            LMCache is imported), gathering the blocks' tokens of every
            layer into its [2, layers, tokens, heads * head] host buffer
            and back: once in one call for all the tokens (its best case)
            and once in calls of 256 tokens, one per host buffer, as its
            vLLM connector moves its chunks;
  kvferry   kvf_offload / kvf_onboard of the same blocks (one pool per
            layer's K and per layer's V, host slots allocated by kvferry).

The KV is vLLM's: per layer one tensor [2, blocks, 16, 8, 128] of bf16
(K and V, 16 tokens a block, 8 KV heads of 128), random bits; the moved
blocks are scattered block ids. Every method's destination is poisoned
before each timed pass and every byte it moved is compared with the
source after its last pass (GPU side in full, as int16; the host side of
kvferry's slots in full too), so a method that moves nothing or the wrong
bytes fails. GB/s count the KV bytes moved (2 x layers x blocks x 32 KiB),
median of the timed passes, each timed on the host from the call to the
end of its work (torch.cuda.synchronize, kvf_wait).

Where LMCache's module cannot load beside this torch, the run says why
(the loader's message, and each symbol it needs that this torch lacks)
and still measures kvferry and the ceiling.

  KVFERRY_LIBRARY=build-gpu/libkvferry.so python3 bench/lmcache_compare.py \\
      --ops /tmp/cuda_ops.cpython-312-x86_64-linux-gnu.so --ops /tmp/c_ops.cpython-312-x86_64-linux-gnu.so \\
      [--json out.json]

(scripts/fetch-lmcache.sh keeps the modules gzipped in .deps/lmcache/<version>/;
scripts/gpu-run.sh unpacks them and passes each.)
"""

import argparse
import ctypes
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

TOKENS, HEADS, HEAD = 16, 8, 128  # vLLM's block: 16 tokens of 8 KV heads of 128
CHUNK_TOKENS = 256  # LMCache's default chunk


def median_gbs(nbytes, seconds):
    return nbytes / statistics.median(seconds) / 1e9


def undefined_symbols(path):
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def defined_symbols(paths):
    names = set()
    for p in paths:
        out = subprocess.run(["nm", "-D", "--defined-only", p], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3:
                names.add(parts[2].split("@")[0])
    return names


def why_not_loaded(path, torch):
    """What this torch lacks of what the module needs: the torch and c10
    symbols it leaves undefined that no library of this torch defines."""
    lines = []
    try:
        need = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        libs = re.findall(r"\[(lib[^\]]+)\]", need)
        lines.append("it links: " + " ".join(libs))
        lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        have = defined_symbols(os.path.join(lib_dir, f) for f in sorted(os.listdir(lib_dir)) if ".so" in f)
        wanted = {s.split("@")[0] for s in undefined_symbols(path)}
        ours = sorted(s for s in wanted if ("c10" in s or "at6" in s or "torch" in s) and s not in have)
        if ours:
            demangled = subprocess.run(["c++filt"], input="\n".join(ours[:12]), capture_output=True,
                                       text=True).stdout.splitlines()
            lines.append(f"{len(ours)} torch/c10 symbol(s) it needs are not in torch {torch.__version__}'s "
                         f"libraries ({lib_dir}), e.g.:")
            lines += ["  " + d for d in demangled]
        else:
            lines.append(f"all {len(wanted)} symbols it leaves undefined checked: every torch/c10 one is in "
                         f"torch {torch.__version__}'s libraries")
    except (OSError, subprocess.SubprocessError) as e:
        lines.append(f"(no symbol check: {e})")
    return lines


def missing_torch_symbols(path, torch):
    """The torch/c10 symbols the module leaves undefined that this torch's
    libraries do not define."""
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    have = defined_symbols(os.path.join(lib_dir, f) for f in sorted(os.listdir(lib_dir)) if ".so" in f)
    wanted = {s.split("@")[0] for s in undefined_symbols(path)}
    return sorted(s for s in wanted if ("c10" in s or "at6" in s or "torch" in s) and s not in have)


def throw_path_stubs(names):
    """A library defining `names` where every one is the constructor of an
    exception class (c10::...Error::...Error): code reaches those only to
    throw, never on a copy. Each stub says what was called and aborts, so a
    run that ever needed one cannot pass for a measurement. None where a
    name is anything else (then the module is not loaded at all)."""
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                               text=True).stdout.splitlines()
    if len(demangled) != len(names) or not all(re.search(r"::(\w*Error)::\1\(", d) for d in demangled):
        return None
    src = ["#include <stdio.h>", "#include <stdlib.h>"]
    for i, (name, d) in enumerate(zip(names, demangled)):
        said = d.replace("\\", "\\\\").replace('"', '\\"')
        src += [f'void kvf_stub_{i}(void) __asm__("{name}");',
                f'void kvf_stub_{i}(void) {{ fputs("lmcache_compare: LMCache threw through {said}, '
                f'which this torch lacks (stubbed): aborting\\n", stderr); abort(); }}']
    d = tempfile.mkdtemp(prefix="kvf-lmcache-stubs-")
    c, so = os.path.join(d, "stubs.c"), os.path.join(d, "stubs.so")
    with open(c, "w") as f:
        f.write("\n".join(src) + "\n")
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", so, c]).returncode != 0:
        return None
    return so, demangled


def exec_ops(path):
    # the module's own name (cuda_ops from LMCache 0.5.6, c_ops before):
    # Python calls PyInit_<name>
    name = os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_ops(paths, torch):
    """The first of LMCache's modules `paths` that loads beside this torch
    with nothing stubbed, else the first that loads beside stubs of its
    throw path: (module, notes), notes saying which and what was stubbed;
    or (None, reasons), each module's."""
    reasons = []
    for stubbed in (False, True):
        for path in paths:
            mod, why = load_one(path, torch, stubbed)
            if mod is not None:
                return mod, [f"module {path}"] + why
            if stubbed:
                reasons += [f"{path}:"] + ["  " + w for w in why]
    return None, reasons


def load_one(path, torch, stubbed):
    """LMCache's module at `path`, or (None, reasons); with `stubbed`, a
    module that lacks only exception constructors is loaded beside stubs of
    them (said in the notes)."""
    if not path or not os.path.exists(path):
        return None, [f"no module at {path!r} (scripts/fetch-lmcache.sh fetches the wheel and keeps it)"]
    notes = []
    try:
        mod = exec_ops(path)
    except Exception as e:  # ImportError, or whatever its init raises
        if not stubbed:
            return None, [f"{type(e).__name__}: {e}"]
        # A module built against a newer torch may need an exception
        # class's constructor this torch lacks: that is only on its throw
        # path, so it loads beside stubs of those alone (said in the output)
        stubs = None
        try:
            stubs = throw_path_stubs(missing_torch_symbols(path, torch))
        except (OSError, subprocess.SubprocessError):
            pass
        if not stubs:
            return None, [f"{type(e).__name__}: {e}"] + why_not_loaded(path, torch)
        ctypes.CDLL(stubs[0], mode=ctypes.RTLD_GLOBAL)
        try:
            mod = exec_ops(path)
        except Exception as e2:
            return None, [f"{type(e2).__name__}: {e2} (with stubs of {', '.join(stubs[1])})"] + \
                why_not_loaded(path, torch)
        notes = [f"loaded beside a stub of {d} (torch {torch.__version__} lacks it; LMCache reaches it only to "
                 f"throw, and the stub aborts the run if it ever does)" for d in stubs[1]]
    missing = [n for n in ("multi_layer_kv_transfer", "TransferDirection", "EngineKVFormat") if not hasattr(mod, n)]
    if missing:
        return None, ["loaded, but it has no " + ", ".join(missing)]
    return mod, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", action="append",
                    help="an LMCache transfer module (.so), tried in the order given (repeat the option)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=512, help="blocks moved (each of every layer)")
    ap.add_argument("--pool-blocks", type=int, default=2048, help="blocks of each layer's GPU tensor")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.blocks * TOKENS % CHUNK_TOKENS or a.blocks > a.pool_blocks:
        sys.exit("lmcache_compare: --blocks must be a multiple of 16 and at most --pool-blocks")

    try:
        import torch
    except ImportError:
        print("lmcache_compare: torch is not installed; skipped")
        return 77
    if not torch.cuda.is_available():
        print("lmcache_compare: no CUDA device: skipped")
        return 77
    import kvferry as kvf

    dev = torch.device("cuda", 0)
    L, N, NB = a.layers, a.blocks, a.pool_blocks
    T = N * TOKENS
    block_kv = TOKENS * HEADS * HEAD * 2  # bytes of one block's K (or V) in one layer
    nbytes = 2 * L * N * block_kv
    print(f"lmcache_compare: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{L} layers x [2, {NB}, {TOKENS}, {HEADS}, {HEAD}] bf16, {N} scattered blocks "
          f"({nbytes / 2**20:.0f} MiB a way), median of {a.reps} passes")

    g = torch.Generator(device=dev).manual_seed(20261207)
    kv = [torch.randint(-32768, 32767, (2, NB, TOKENS, HEADS, HEAD), dtype=torch.int16, device=dev,
                        generator=g).view(torch.bfloat16) for _ in range(L)]
    ids = torch.randperm(NB, generator=g, device=dev)[:N]
    ids_list = ids.tolist()
    ref = [x.view(torch.int16)[:, ids].clone() for x in kv]  # [2, N, 16, 8, 128] per layer
    POISON = -21931  # 0xAA55

    def poison_gpu():
        for x in kv:
            x.view(torch.int16)[:, ids] = POISON
        torch.cuda.synchronize()

    def gpu_matches():
        return all(torch.equal(x.view(torch.int16)[:, ids], r) for x, r in zip(kv, ref))

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": L, "blocks": N,
           "bytes": nbytes, "methods": {}}

    def record(name, d2h, h2d, ok, note=""):
        res["methods"][name] = {"d2h_gbs": d2h, "h2d_gbs": h2d, "verified": ok, "note": note}

    # ---- the ceiling: one copy of the same bytes, contiguous
    host = torch.empty(nbytes // 2, dtype=torch.int16, pin_memory=True)
    flat = torch.randint(-32768, 32767, (nbytes // 2,), dtype=torch.int16, device=dev, generator=g)
    t_d, t_h = [], []
    for r in range(a.reps + 1):
        host.fill_(POISON)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(flat, non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        back = torch.empty_like(flat)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        back.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        if r:
            t_d.append(t1 - t0)
            t_h.append(t3 - t2)
    ok = torch.equal(back, flat)
    record("ceiling", median_gbs(nbytes, t_d), median_gbs(nbytes, t_h), ok)
    del back, flat, host

    # ---- LMCache's kernel
    ops, why = load_ops(a.ops or [], torch)
    if ops is None:
        print("lmcache: not measured: no LMCache module loaded beside this torch:")
        for line in why:
            print("  " + line)
        res["lmcache_not_loaded"] = why
    else:
        for line in why:
            print("lmcache: " + line)
        res["lmcache_notes"] = why
        fmt = ops.EngineKVFormat.NL_X_TWO_NB_BS_NH_HS
        ptrs = torch.tensor([x.data_ptr() for x in kv], dtype=torch.int64, device=dev)
        offs = torch.arange(TOKENS, device=dev)
        slots = (ids[:, None] * TOKENS + offs[None, :]).reshape(-1).to(torch.int64)  # [T]

        # block_stride_elems came with LMCache 0.5.6 (0 there: its blocks
        # packed, as here); releases before it take the rest alone
        extra = {"block_stride_elems": 0} if "block_stride_elems" in (ops.multi_layer_kv_transfer.__doc__ or "") \
            else {}

        def lmc_call(buf, slot_mapping, direction):
            ops.multi_layer_kv_transfer(buf, ptrs, slot_mapping, dev, NB * TOKENS, direction, fmt,
                                        block_size=TOKENS, head_size=HEAD, skip_prefix_n_tokens=0, **extra)

        for chunked in (False, True):
            name = "lmcache, 256-token calls" if chunked else "lmcache, one call"
            step = CHUNK_TOKENS if chunked else T
            bufs = [torch.empty((2, L, step, HEADS * HEAD), dtype=torch.bfloat16, pin_memory=True)
                    for _ in range(T // step)]
            t_d, t_h = [], []
            try:
                for r in range(a.reps + 1):
                    for b in bufs:
                        b.view(torch.int16).fill_(POISON)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for k, b in enumerate(bufs):
                        lmc_call(b, slots[k * step:(k + 1) * step], ops.TransferDirection.D2H)
                    torch.cuda.synchronize()
                    t1 = time.perf_counter()
                    poison_gpu()
                    t2 = time.perf_counter()
                    for k, b in enumerate(bufs):
                        lmc_call(b, slots[k * step:(k + 1) * step], ops.TransferDirection.H2D)
                    torch.cuda.synchronize()
                    t3 = time.perf_counter()
                    if r:
                        t_d.append(t1 - t0)
                        t_h.append(t3 - t2)
                # the host buffers hold every token of every layer's K and V
                host_ok = True
                for k, b in enumerate(bufs):
                    got = b.to(dev).view(torch.int16)  # [2, L, step, 1024]
                    for l in range(L):
                        want = ref[l].reshape(2, T, HEADS * HEAD)[:, k * step:(k + 1) * step]
                        host_ok &= torch.equal(got[:, l], want)
                ok = host_ok and gpu_matches()
                record(name, median_gbs(nbytes, t_d), median_gbs(nbytes, t_h), ok)
            except Exception as e:  # a call refused: say so (its first lines), measure the rest
                said = "\n".join(str(e).splitlines()[:4])
                print(f"{name}: failed: {type(e).__name__}: {said}")
                res.setdefault("lmcache_errors", []).append(f"{name}: {type(e).__name__}: {said}")
            del bufs
            for x, r in zip(kv, ref):  # restore the KV for the next method
                x.view(torch.int16)[:, ids] = r

    # ---- kvferry
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=TOKENS, head_size=HEAD,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    with kvf.Engine(backend=kvf.Backend.CUDA) as e:
        pools = [e.add_pool(geom, primary=x[i], secondary=N) for x in kv for i in (0, 1)]
        import numpy as np
        off = np.array([(b, j) for j, b in enumerate(ids_list)], dtype=np.int64)
        on = np.ascontiguousarray(off[:, ::-1])
        views = [[p.slot_view(j, kvf.Level.SECONDARY) for j in range(N)] for p in pools]
        t_d, t_h = [], []
        for r in range(a.reps + 1):
            for vs in views:  # poison the host slots
                for v in vs:
                    v[:] = 0xA5
            t0 = time.perf_counter()
            e.offload(kvf.Tier.HOST, off).wait(check=True)
            t1 = time.perf_counter()
            poison_gpu()
            t2 = time.perf_counter()
            e.onboard(kvf.Tier.HOST, on).wait(check=True)
            t3 = time.perf_counter()
            if r:
                t_d.append(t1 - t0)
                t_h.append(t3 - t2)
        # the host slots hold the blocks (every byte), and the GPU got them back
        host_ok = True
        for li in range(L):
            for kvi in (0, 1):
                want = ref[li][kvi].cpu().numpy().view(np.uint8).reshape(N, -1)
                for j, v in enumerate(views[2 * li + kvi]):
                    host_ok &= bool(np.array_equal(v.reshape(-1), want[j]))
        del views
        ok = host_ok and gpu_matches()
        record("kvferry", median_gbs(nbytes, t_d), median_gbs(nbytes, t_h), ok)

    ceil = res["methods"]["ceiling"]
    print(f"{'method':28s} {'GPU->host GB/s':>15s} {'x ceil':>7s} {'host->GPU GB/s':>15s} {'x ceil':>7s}  bytes")
    for name, m in res["methods"].items():
        print(f"{name:28s} {m['d2h_gbs']:15.2f} {m['d2h_gbs'] / ceil['d2h_gbs']:7.2f} "
              f"{m['h2d_gbs']:15.2f} {m['h2d_gbs'] / ceil['h2d_gbs']:7.2f}  "
              f"{'verified' if m['verified'] else 'WRONG'}")
    k = res["methods"]["kvferry"]
    lmc = [m for n, m in res["methods"].items() if n.startswith("lmcache")]
    if lmc:
        best = {d: max(m[d] for m in lmc) for d in ("d2h_gbs", "h2d_gbs")}
        print(f"kvferry / LMCache's best: GPU->host {k['d2h_gbs'] / best['d2h_gbs']:.2f}x, "
              f"host->GPU {k['h2d_gbs'] / best['h2d_gbs']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    bad = [n for n, m in res["methods"].items() if not m["verified"]]
    if bad:
        print("lmcache_compare: WRONG BYTES: " + ", ".join(bad))
        return 1
    print("lmcache_compare: every byte verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
