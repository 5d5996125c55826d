# SPDX-License-Identifier: Apache-2.0
"""Cache puts off the engine's step thread: the step queues a Save and
returns; one saver thread per cache issues the puts (after the compute
stream's event on CUDA) in order. Whoever queued a Save retires it on its
own thread (poll, wait): the saver thread only submits."""

import logging
import queue
import threading
from typing import List, Optional, Sequence, Set

from .._errors import KvferryError

log = logging.getLogger("kvferry.integrations")


class Save:
    """One queued put of keys[i] from primary slot slots[i], for the
    requests rids. The slots must not be written until done() (or wait())
    says the put read them; a put the cache refused reads nothing
    (refused: stored nowhere, a later miss)."""

    __slots__ = ("keys", "slots", "rids", "transient", "after", "ticket", "refused", "_issued")

    def __init__(self, keys: List[int], slots: List[int], rids: Set[str], transient: bool = False, after=None):
        self.keys, self.slots, self.rids, self.transient = keys, slots, rids, transient
        self.after = after  # a torch.cuda.Event the forward's writes precede, or None
        self.ticket = None
        self.refused = False
        self._issued = threading.Event()

    def done(self) -> bool:
        """Issued, and its put complete or refused (never blocks)."""
        return self._issued.is_set() and (self.ticket is None or self.ticket.poll() is not None)

    def wait(self) -> None:
        """Until the put has read every slot (or was refused)."""
        self._issued.wait()
        if self.ticket is not None:
            self.ticket.wait()

    def failed(self) -> List[int]:
        """Indices of the keys not stored (waits): all of them if refused."""
        self.wait()
        if self.ticket is None:
            return list(range(len(self.keys)))
        return self.ticket.failed()


class Saver:
    """A thread issuing cache.put for queued Saves, at `priority`."""

    def __init__(self, cache, priority: int, name: str = "kvferry-saver"):
        self._cache, self._priority = cache, priority
        self._queue: "queue.SimpleQueue[Optional[Save]]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def queue(self, s: Save) -> None:
        self._queue.put(s)

    def _run(self) -> None:
        while True:
            s = self._queue.get()
            if s is None:
                return
            try:
                if s.after is not None:
                    s.after.synchronize()  # the forward has written the blocks
                s.ticket = self._cache.put(s.keys, s.slots, self._priority)
            except KvferryError as exc:  # nothing started: a later miss, never a wrong block
                log.warning("kvferry: save of %d blocks refused: %s", len(s.keys), exc)
                s.refused = True
            except BaseException as exc:  # noqa: BLE001 - the thread must go on; the save is lost, not wrong
                log.error("kvferry: save of %d blocks failed: %r", len(s.keys), exc)
                s.refused = True
            finally:
                s._issued.set()

    def close(self, pending: Sequence[Save] = ()) -> None:
        """Issues what is queued, stops the thread, then waits for pending."""
        self._queue.put(None)
        self._thread.join()
        for s in pending:
            s.wait()
