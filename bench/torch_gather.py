#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's gather-then-copy path, the one PyTorch users already have, on
the same block sizes as `kvferry bench --compare`: offload = index_select of
scattered blocks on the GPU, then one copy_ into pinned host memory; onboard
= one copy_ to the GPU, then index_copy_ into the scattered slots. Prints
GB/s next to the ceiling (one large pinned copy) measured in the same run,
and verifies every byte. Skips (exit 77) without torch or a GPU."""
import sys

try:
    import torch
except ImportError:
    print("torch_gather: torch is not installed; skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("torch_gather: no GPU; skipped")
    sys.exit(77)

REPS = 7
TOTAL = 256 << 20


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    dev = torch.device("cuda")
    print(f"torch_gather: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"median of {REPS}, {TOTAL >> 20} MiB per run")
    print(f"{'block':>8} {'ceil d2h':>9} {'ceil h2d':>9} {'torch d2h':>10} {'torch h2d':>10}"
          f" {'x ceil d2h':>11} {'x ceil h2d':>11}")
    bad = 0
    for kib in (4, 16, 64, 256, 1024, 4096):
        block = kib * 1024
        n = max(64, min(65536, TOTAL // block))
        words = block // 2
        gpu = torch.randint(-30000, 30000, (n, words), dtype=torch.int16, device=dev)
        host = torch.empty((n, words), dtype=torch.int16, pin_memory=True)
        perm = torch.randperm(n, device=dev)
        staging = torch.empty_like(gpu)
        flat_h = host.view(-1)
        flat_g = gpu.view(-1)

        def ceil_d2h():
            flat_h.copy_(flat_g, non_blocking=True)

        def ceil_h2d():
            flat_g.copy_(flat_h, non_blocking=True)

        def gather_d2h():
            torch.index_select(gpu, 0, perm, out=staging)
            host.copy_(staging, non_blocking=True)

        back = torch.empty_like(gpu)

        def scatter_h2d():
            staging.copy_(host, non_blocking=True)
            back.index_copy_(0, perm, staging)

        c1, c2 = timed(ceil_d2h), timed(ceil_h2d)
        t1 = timed(gather_d2h)
        t2 = timed(scatter_h2d)
        torch.cuda.synchronize()
        # host holds gpu[perm]; back must equal gpu again
        if not torch.equal(host.to(dev), gpu[perm]) or not torch.equal(back, gpu):
            bad += 1
        nbytes = n * block
        g = lambda t: nbytes / t / 1e9
        print(f"{kib:>5}KiB {g(c1):9.1f} {g(c2):9.1f} {g(t1):10.1f} {g(t2):10.1f}"
              f" {g(t1) / g(c1):11.2f} {g(t2) / g(c2):11.2f}")
    print("torch_gather: all bytes verified" if bad == 0 else f"torch_gather: {bad} sizes WRONG")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
