# SPDX-License-Identifier: Apache-2.0
"""Tickets of submitted batches, and the handles that issue them (an Engine, a Cache)."""

import ctypes
from typing import List, Optional

from . import _lib
from ._cargs import c_int
from ._enums import Status, status
from ._errors import MoveError, check, make_error
from ._moves import _is_int
from ._streams import _stream_handle, _torch_stream

_SENTINEL = 0x7FFF_FFFF  # never a kvf_status: tells "nothing written" apart


class Ticket:
    """A submitted batch. poll() / wait() return one Status per move once the
    batch is complete (and keep returning it); a failed move's status says
    which block is lost, errors() why. wait(check=True) raises instead: the
    first failed move's error, carrying every failure (.failures)."""

    __slots__ = ("engine", "id", "count", "_statuses", "_errors", "_error_count")

    def __init__(self, engine, ticket_id: int, count: int):
        self.engine, self.id, self.count, self._statuses = engine, ticket_id, count, None
        self._errors, self._error_count = (), 0

    def __int__(self):
        return self.id

    def __index__(self):
        return self.id

    def __repr__(self):
        st = self._statuses
        state = "pending" if st is None else ("ok" if all(s == Status.OK for s in st) else "failed")
        return f"<kvferry.Ticket {self.id}: {self.count} moves, {state}>"

    def _take(self, result) -> None:
        if result is not None:
            self._statuses, self._errors, self._error_count = result

    def poll(self) -> Optional[List[Status]]:
        """None while in flight, else the per-move statuses."""
        if self._statuses is None:
            self._take(self.engine._result(self.id, self.count, block=False))
        return self._statuses

    def wait(self, check: bool = False) -> List[Status]:
        """Blocks until complete; the per-move statuses. check=True raises
        when a move failed: the first failed move's error class (IOFailure,
        Corrupt, ...), its .failures a MoveError for each failed move."""
        if self._statuses is None:
            self._take(self.engine._result(self.id, self.count, block=True))
        if check:
            self.raise_for_status()
        return self._statuses

    def wait_pool(self, pool: int) -> None:
        """Blocks until pool `pool` of every move has arrived, without
        retiring the ticket (wait() still gives the statuses); raises the
        failure of a move already known, or ERR_RANGE for a pool the batch
        does not move (kvf_wait_pool). A batch already waited for returns
        at once, raising if a move failed."""
        self._wait_pool(pool, None)

    def stream_wait_pool(self, pool: int, stream=None) -> None:
        """As wait_pool, but work queued on `stream` after this call waits
        for the pool on the GPU, the host only until the batch is on the
        device (kvf_stream_wait_pool). stream: a torch.cuda.Stream, an
        object with .cuda_stream or __cuda_stream__, or an int
        cudaStream_t; None: torch's current stream where torch has CUDA,
        else a host wait."""
        self._wait_pool(pool, _stream_handle(stream, "stream_wait_pool") if stream is not None
                        else _torch_stream())

    def _wait_pool(self, pool, handle) -> None:
        if self._statuses is not None:
            self.raise_for_status()
            return
        if not _is_int(pool) or not 0 <= pool < 2**32:
            raise make_error(Status.ERR_INVALID, f"wait_pool: pool {pool!r} is not a pool index")
        self.engine._wait_pool(self.id, int(pool), handle)

    @property
    def done(self) -> bool:
        return self.poll() is not None

    @property
    def statuses(self) -> Optional[List[Status]]:
        return self._statuses

    @property
    def ok(self) -> bool:
        """Complete and every move succeeded (polls)."""
        st = self.poll()
        return st is not None and all(s == Status.OK for s in st)

    def failed(self) -> List[int]:
        """Indices of the moves that failed (waits)."""
        return [i for i, s in enumerate(self.wait()) if s != Status.OK]

    def errors(self) -> List[MoveError]:
        """Why moves failed, without raising (waits): a MoveError (index,
        status, message naming block, slot, file or node and the reason) per
        failed move in index order; the first ERRORS_KEPT of them when more
        failed (error_count says how many did)."""
        self.wait()
        return list(self._errors)

    @property
    def error_count(self) -> int:
        """Moves that failed (waits); errors() holds at most ERRORS_KEPT."""
        self.wait()
        return self._error_count

    def raise_for_status(self) -> None:
        st = self.wait()
        if self._error_count == 0:
            return
        first = self._errors[0] if self._errors else None
        if first is None:  # cannot happen: a failure always has its message
            i = next(i for i, s in enumerate(st) if s != Status.OK)
            first = MoveError(i, st[i], _lib.status_str(st[i]))
        err = make_error(first.status, f"ticket {self.id}: {self._error_count} of {self.count} moves failed; "
                                       f"move {first.index}: {first.message}")
        err.failures = tuple(self._errors)
        raise err


ERRORS_KEPT = 64  # failed moves' messages a Ticket keeps (their statuses are all kept)


class _Handle:
    """A C handle closed by close() (idempotent), a context manager, and
    closed when collected. Subclasses set _what ("engine", "cache")."""

    _what = "handle"
    _handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _h(self):
        if self._handle is None:
            raise make_error(Status.ERR_STATE, f"{self._what} is closed")
        return self._handle


class _Issuer(_Handle):
    """Tickets of an Engine (kvf_wait_errors / kvf_poll_errors) or a Cache
    (kvf_cache_wait_errors / kvf_cache_poll_errors): set _wait_fn and
    _poll_fn, _h() and _pending / _lock."""

    _wait_fn = _poll_fn = _ticket_t = None

    def _result(self, ticket_id, count, block):
        """None while in flight, else (statuses, MoveErrors kept, failures)."""
        per = (_lib.c_status * max(count, 1))(*([_SENTINEL] * max(count, 1)))
        cap = min(max(count, 1), ERRORS_KEPT)
        errs = (_lib.MoveError_t * cap)()
        n_err = ctypes.c_size_t(_SENTINEL)
        fn = self._wait_fn if block else self._poll_fn
        ret = fn(self._h(), self._ticket_t(ticket_id), per if count else None, errs, cap, ctypes.byref(n_err))
        if ret == Status.INPROGRESS:
            return None
        if ret < 0 and n_err.value == _SENTINEL:
            raise make_error(ret)  # the call itself failed (unknown ticket, ...)
        with self._lock:
            self._pending.pop(ticket_id, None)
        kept = tuple(MoveError(int(e.index), status(e.status), e.message.decode(errors="replace"))
                     for e in errs[:min(n_err.value, cap)])
        return [status(per[i]) for i in range(count)], kept, int(n_err.value)

    def _issue(self, ticket_id: int, count: int) -> Ticket:
        with self._lock:
            self._pending[ticket_id] = count
        return Ticket(self, ticket_id, count)

    def _ticket(self, ticket) -> Ticket:
        if isinstance(ticket, Ticket):
            return ticket
        tid = int(ticket)
        with self._lock:
            n = self._pending.get(tid, 0)
        return Ticket(self, tid, n)

    _wait_pool_fn = _stream_wait_pool_fn = None

    def _wait_pool(self, ticket_id: int, pool: int, stream) -> None:
        t = self._ticket_t(ticket_id)
        pool = c_int(pool, ctypes.c_uint32, "wait_pool: pool")
        if stream is None:
            check(self._wait_pool_fn(self._h(), t, pool))
        else:
            check(self._stream_wait_pool_fn(self._h(), t, pool, stream))

    def poll(self, ticket) -> Optional[List[Status]]:
        """As Ticket.poll, for a Ticket or a ticket number. A number never
        issued here, or one already retired, raises UnknownTicket."""
        return self._ticket(ticket).poll()

    def wait(self, ticket, check: bool = False) -> List[Status]:
        """As Ticket.wait, for a Ticket or a ticket number."""
        return self._ticket(ticket).wait(check)
