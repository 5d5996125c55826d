# SPDX-License-Identifier: Apache-2.0
"""Timed runs without Python's cyclic garbage collector in them.

A full (generation 2) collection with torch and transformers loaded walks
every object the process holds: 135-159 ms on a 2-core CI machine
(bench/results/host-ttft-gc.txt), where bench/ttft.py --tiny --quick timed
its 1024-token disk row's second plan run at 152-175 ms against 10-12 ms
(the forward pass stalled, every layer's loads in time). Such a pause is
the host program's (vLLM's engine core freezes the collector once it has
started), not what the bench measures, and it lands on whichever run
crosses the collector's threshold. As timeit does, the collector is off
while a run is timed; a collection its allocations call for runs once it is
back on, outside the clock. (A collection forced before every run instead
left the runs colder: in two of three tries the first plan run waited 3.5
ms for its loads, against 0.2-1.9 ms without.)
"""
import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    """The collector off until the block ends (as it was, after)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
