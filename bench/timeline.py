#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads a timeline written with KVF_TIMELINE=FILE and prints, for each
submit of more than --min-moves moves, when each of its batches (or parts)
was registered, handed to the backend, reported copied and completed, in
microseconds from the submit's start, with the gaps between successive
copies' ends; --summary prints instead the medians over all such submits
of when the checks ended, the first batch was handed to the backend, the
submit returned and the last batch completed; --chunks prints, for each
batch run by the workers (file and remote tiers, the host backend), when
each worker thread finished its chunks of it: how evenly they shared it.
--gpu prints, for each such submit, when its checks ended and each part
was registered, when the engine handed the backend each call, when the
CUDA backend picked the call's path and queued its descriptors' upload
(kernel path) and when it queued each
of its records (a record: one kernel launch group or DMA call; queue 0
offload, 1 onboard) and when its watcher saw it end, and each wait of more
than 20 us for the engine lock, with the line of engine.c that waited.
--skip K leaves out the first K such submits (a run's first batches pay
one-time costs, such as a queue's first kernel-path batch making its
upload stream).
--waits follows each small submit (at most --small moves) made right after
a large one on the same thread, as `kvferry bench --mode contention`'s
evicting phase does (an offload whose first moves read the slots the small
onboard then writes): the medians, from the small submit's start, of when
the large batch's first call (or the host backend's first chunk) ended
(the slots' bytes gone), when the small
batch was issued, handed its first call to the backend, when its records
were queued and ended on the GPU and when it completed, and how many of the
large batch's records ended between its first and the small batch's last.
Usage: timeline.py FILE [--min-moves N] [--limit K] [--skip K]
                        [--summary | --chunks | --gpu | --waits [--small N]]"""
import argparse
import collections


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            t, thr, name, bid, n = line.split()
            ev.append((int(t), int(thr), name, int(bid), int(n)))
    ev.sort()
    return ev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--min-moves", type=int, default=4097)
    ap.add_argument("--limit", type=int, default=4)
    # the first submits of a run pay one-time costs (a queue's first
    # batch makes the kernel path's upload stream): --skip shows later ones
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--chunks", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--waits", action="store_true")
    ap.add_argument("--small", type=int, default=64)
    a = ap.parse_args()
    ev = load(a.file)
    if a.waits:
        waits(ev, a.small, a.skip)
        return
    # per batch id: the first time of each event after the submit that made it
    shown = 0
    summary = []
    skipped = 0
    for k, (t0, thr0, name, _, n) in enumerate(ev):
        if name != "submit" or n < a.min_moves:
            continue
        if skipped < a.skip:
            skipped += 1
            continue
        parts, marks = [], {}
        steps = collections.defaultdict(dict)
        chunks = collections.defaultdict(list)
        # this submit's parts are registered before the thread's next
        # submit; their later steps may come after it (both directions at
        # once), so the scan goes on until each part has completed
        mine = True
        for t, thr, nm, bid, m in ev[k + 1:]:
            if thr == thr0 and nm == "submit":
                if all("complete" in steps[p] for p in parts):
                    break
                mine = False
            if mine and thr == thr0 and nm in ("checked", "submitted") and nm not in marks:
                marks[nm] = t
            if mine and nm == "part" and thr == thr0:
                parts.append(bid)
            elif nm == "part" and bid not in parts:
                continue
            if nm in ("part", "issue", "call", "issued", "copied", "complete"):
                steps[bid].setdefault(nm, (t, thr, m))
            if nm == "chunk":
                chunks[bid].append((t, thr, m))
        parts = [p for p in parts if "complete" in steps[p]]
        if not parts:
            continue
        us = lambda t: (t - t0) / 1e3
        if a.chunks:
            for p in parts:
                per = collections.defaultdict(list)
                for t, thr, m in chunks[p]:
                    per[thr].append((t, m))
                if not per:
                    continue
                ends = "  ".join(f"thread {thr}: {len(v)} chunks, {sum(m for _, m in v)} moves, "
                                 f"last at {us(v[-1][0]):.0f}" for thr, v in sorted(per.items()))
                print(f"submit of {n} at +0: batch {p} complete at "
                      f"{us(steps[p]['complete'][0]):.0f} us; {ends}")
            shown += 1
            if shown >= a.limit:
                break
            continue
        if a.gpu:
            # the CUDA backend's records (queue 0 offload, 1 onboard) and
            # the waits for the engine lock, from this submit's start to
            # its last part's completion
            t_end = max(steps[p]["complete"][0] for p in parts)
            print(f"submit of {n} moves on thread {thr0}: last part complete at {us(t_end):.0f} us")
            queued = {}
            # the threads that handed this submit's calls to the backend
            callers = {s["call"][1] for s in (steps[p] for p in parts) if "call" in s}
            if "checked" in marks:
                print(f"  checked at {us(marks['checked']):7.0f}")
            for t, thr, nm, bid, m in ev[k:]:
                if t > t_end:
                    break
                if nm == "gpu_queued":
                    queued[bid] = (t, m)
                elif nm == "gpu_ended" and bid in queued:
                    tq, m = queued.pop(bid)
                    print(f"  queue {bid >> 56} record {bid & ((1 << 56) - 1):6d}: {m:5d} copies,"
                          f" queued {us(tq):7.0f}, ended {us(t):7.0f}")
                elif nm == "call" and bid in parts:
                    print(f"  batch {bid} handed the backend a call of {m} copies at {us(t):7.0f}")
                elif nm == "part" and bid in parts:
                    print(f"  batch {bid} of {m} moves registered at {us(t):7.0f}")
                elif nm in ("gpu_picked", "gpu_uploaded") and thr in callers:
                    what = f"picked path {m}" if nm == "gpu_picked" else f"queued an upload of {m} descriptors"
                    print(f"  queue {bid}: the backend {what} at {us(t):7.0f}")
                elif nm == "lockwait":
                    print(f"  thread {thr} waited {m / 1e3:5.0f} us for the engine lock"
                          f" (engine.c:{bid}), until {us(t):7.0f}")
            shown += 1
            if shown >= a.limit:
                break
            continue
        if a.summary:
            issued = [us(steps[p]["issue"][0]) for p in parts if "issue" in steps[p]]
            calls = [us(steps[p]["call"][0]) for p in parts if "call" in steps[p]]
            summary.append((us(marks.get("checked", t0)), min(issued) if issued else float("nan"),
                            us(marks.get("submitted", t0)),
                            max(us(steps[p]["complete"][0]) for p in parts),
                            min(calls) if calls else float("nan")))
            continue
        prev_end = next((t for t, thr, nm, _, _ in reversed(ev[:k])
                         if thr == thr0 and nm == "submitted"), None)
        after = f", {(t0 - prev_end) / 1e3:.0f} us after the previous returned" if prev_end else ""
        print(f"submit of {n} moves on thread {thr0}{after}: checked at"
              f" {us(marks.get('checked', t0)):.0f} us, returned at"
              f" {us(marks.get('submitted', t0)):.0f} us")
        print("  batch   moves  registered  issue(thr)      issued  copied  complete  gap")
        prev = None
        for p in parts:
            s = steps[p]
            g = lambda nm: f"{us(s[nm][0]):8.0f}" if nm in s else "       -"
            cp = s.get("copied")
            gap = f"{(cp[0] - prev) / 1e3:5.0f}" if cp and prev else "    -"
            if cp:
                prev = cp[0]
            thr = s["issue"][1] if "issue" in s else 0
            print(f"  {p:6d} {s['part'][2]:6d}   {g('part')}  {g('issue')}({thr}) {g('issued')} {g('copied')} {g('complete')}  {gap}")
        shown += 1
        if shown >= a.limit:
            break
    if summary:
        med = lambda k: sorted(x[k] for x in summary)[len(summary) // 2]
        print(f"{len(summary)} submits, medians (us from the submit's start): checked {med(0):.0f},"
              f" first issue {med(1):.0f}, first call to the backend {med(4):.0f}, returned {med(2):.0f},"
              f" last complete {med(3):.0f}")


def waits(ev, small, skip):
    """--waits: see the module's doc."""
    # per batch: its first registration, issue, call, copied, complete;
    # per thread: its submits in order
    first = collections.defaultdict(dict)
    copied = collections.defaultdict(list)
    part_thread = {}
    submits = []
    by_thread = collections.defaultdict(list)
    gpu = []  # (queue, queued, ended)
    queued = {}
    for t, thr, nm, bid, n in ev:
        if nm == "submit":
            s = {"t": t, "n": n, "thr": thr, "parts": []}
            submits.append(s)
            by_thread[thr].append(s)
        elif nm == "part" and by_thread[thr]:
            by_thread[thr][-1]["parts"].append(bid)
            part_thread[bid] = thr
        if nm in ("part", "issue", "call", "complete"):
            first[bid].setdefault(nm, t)
        elif nm in ("copied", "chunk"):
            # a call's end (the GPU) or a worker's chunk (the host backend)
            copied[bid].append(t)
        elif nm == "gpu_queued":
            queued[bid] = t
        elif nm == "gpu_ended" and bid in queued:
            gpu.append((bid >> 56, queued.pop(bid), t))
    rows = []
    for lst in by_thread.values():
        for big, sm in zip(lst, lst[1:]):
            if big["n"] <= small or sm["n"] > small or not big["parts"] or not sm["parts"]:
                continue
            b0, s_ids = big["parts"][0], sm["parts"]
            if not copied[b0] or any("complete" not in first[i] for i in s_ids):
                continue
            t0 = sm["t"]
            done = max(first[i]["complete"] for i in s_ids)
            # the small batch's records: onboard queue (1) records queued
            # after its first call and ended by its completion
            t_call = min((first[i].get("call", done) for i in s_ids))
            mine = [(q, tq, te) for q, tq, te in gpu if q == 1 and t_call <= tq <= done]
            others = [te for q, tq, te in gpu if q == 0 and copied[b0][0] <= te <= done]
            rows.append({
                "gone": (copied[b0][0] - t0) / 1e3,
                "issue": (min(first[i].get("issue", done) for i in s_ids) - t0) / 1e3,
                "call": (t_call - t0) / 1e3,
                "gpu_queued": (min((tq for _, tq, _ in mine), default=done) - t0) / 1e3,
                "gpu_ended": (max((te for _, _, te in mine), default=done) - t0) / 1e3,
                "complete": (done - t0) / 1e3,
                "big_records": len(others),
            })
    rows = rows[skip:]
    if not rows:
        print("no small submit right after a large one on the same thread")
        return
    cols = ["gone", "issue", "call", "gpu_queued", "gpu_ended", "complete", "big_records"]
    print(f"{len(rows)} small submits after a large one (us from the small submit's start;"
          f" big_records: the large batch's records ended meanwhile)")
    for q in (0.5, 0.9, 0.99):
        vals = "  ".join(f"{c} {sorted(r[c] for r in rows)[min(len(rows) - 1, int(q * len(rows)))]:.0f}"
                         for c in cols)
        print(f"  p{int(q * 100):02d}: {vals}")


if __name__ == "__main__":
    main()
