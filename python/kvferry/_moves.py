# SPDX-License-Identifier: Apache-2.0
"""Batches the C API takes: moves (kvf_move), and arrays of keys, slots or pool indices."""

import ctypes
import numbers
from typing import TYPE_CHECKING, NamedTuple, Optional

from . import _lib
from ._cargs import c_key
from ._enums import Status, Tier
from ._errors import make_error

if TYPE_CHECKING:
    import numpy as np


class Move(NamedTuple):
    """One block to move; tokens 0 means the whole block."""

    src: int
    dst: int
    tokens: int = 0


def move_dtype() -> "np.dtype":
    """The NumPy structured dtype laid out as kvf_move (40 bytes): src,
    dst, tokens, and the block key's halves key_hi, key_lo (DISK and
    REMOTE moves name their block there; src / dst then 0 on that side)."""
    import numpy as np

    return np.dtype({"names": ["src", "dst", "tokens", "key_hi", "key_lo"],
                     "formats": ["<u8", "<u8", "<u4", "<u8", "<u8"],
                     "offsets": [0, 8, 16, 24, 32], "itemsize": 40})


def _key_side(tier, into: bool) -> Optional[str]:
    """Which of a move's (src, dst) is the block key: a move into DISK or
    REMOTE keys its dst, one out of them its src; slot moves: None."""
    if tier is None or Tier(tier) not in (Tier.DISK, Tier.REMOTE):
        return None
    return "dst" if into else "src"



def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _moves_from_numpy(a, side=None):
    import numpy as np

    dt = move_dtype()
    if a.dtype.names:
        if "src" not in a.dtype.names or "dst" not in a.dtype.names:
            raise make_error(Status.ERR_INVALID, "moves: a structured array needs fields 'src' and 'dst'")
        a = a.reshape(-1)
        out = np.zeros(a.shape[0], dt)
        for f in ("src", "dst", "tokens", "key_hi", "key_lo"):
            if f in a.dtype.names:
                col = a[f]
                if np.issubdtype(col.dtype, np.signedinteger) and (col < 0).any():
                    raise make_error(Status.ERR_INVALID, f"moves: negative {f}")
                out[f] = col
        return out
    if not np.issubdtype(a.dtype, np.integer):
        raise make_error(Status.ERR_INVALID, f"moves: an integer array is needed, not {a.dtype}")
    if a.ndim == 1 and a.shape[0] in (2, 3):
        a = a.reshape(1, -1)
    if a.ndim != 2 or a.shape[1] not in (2, 3):
        raise make_error(Status.ERR_INVALID, f"moves: an int array of shape (n, 2) or (n, 3) is needed, not {a.shape}")
    if np.issubdtype(a.dtype, np.signedinteger) and (a < 0).any():
        raise make_error(Status.ERR_INVALID, "moves: negative slot, key or token count")
    out = np.zeros(a.shape[0], dt)
    out["src"] = a[:, 0]
    out["dst"] = a[:, 1]
    if a.shape[1] == 3:
        if (a[:, 2] >= 2**32).any():
            raise make_error(Status.ERR_INVALID, "moves: token count above 2^32")
        out["tokens"] = a[:, 2]
    return out


def _as_moves(moves, side=None):
    """(pointer, count, keepalive) for one move or a batch. side: which of
    (src, dst) holds the block key for DISK and REMOTE moves (_key_side):
    an int below 2**128, moved into kvf_move.key, that side left 0."""
    if type(moves).__module__ == "numpy" and hasattr(moves, "dtype"):
        if moves.ndim == 0:  # one structured element
            moves = moves.reshape(1)
        arr = _moves_from_numpy(moves)
        if side is not None:
            take = (arr["key_hi"] == 0) & (arr["key_lo"] == 0)
            arr["key_lo"][take] = arr[side][take]
            arr[side] = 0
        return arr.ctypes.data, arr.shape[0], arr
    if isinstance(moves, (tuple, list)) and moves and _is_int(moves[0]):
        moves = [moves]  # one move
    seq = list(moves)
    arr = (_lib.Move_t * max(len(seq), 1))()
    for i, m in enumerate(seq):
        if isinstance(m, dict):
            m = (m["src"], m["dst"], m.get("tokens", 0))
        try:
            vals = tuple(int(v) for v in m)
        except TypeError:
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} is {m!r}, not (src, dst[, tokens])") from None
        if len(vals) not in (2, 3):
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} has {len(vals)} fields, not (src, dst[, tokens])")
        src, dst, tokens = vals if len(vals) == 3 else vals + (0,)
        if side is not None:
            key = src if side == "src" else dst
            arr[i].key = c_key(key, f"moves: entry {i}: {side}")
            src, dst = (0, dst) if side == "src" else (src, 0)
        if not (0 <= src < 2**64 and 0 <= dst < 2**64 and 0 <= tokens < 2**32):
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} = {vals} is out of range (unsigned src/dst, 32-bit tokens)")
        arr[i].src, arr[i].dst, arr[i].tokens = src, dst, tokens
    return ctypes.addressof(arr), len(seq), arr


def _uint_array(values, what, bits=64, item="value"):
    """(pointer, count, keepalive) of an array of unsigned `bits`-bit ints
    (64 or 32) from one int, a list of ints or an integer NumPy array."""
    ctype, limit = (ctypes.c_uint64, 2**64) if bits == 64 else (ctypes.c_uint32, 2**32)
    if _is_int(values):
        values = [values]
    if type(values).__module__ == "numpy" and hasattr(values, "dtype"):
        import numpy as np

        a = values.reshape(-1)
        if not np.issubdtype(a.dtype, np.integer):
            raise make_error(Status.ERR_INVALID, f"{what}: an integer array is needed, not {a.dtype}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= limit):
            raise make_error(Status.ERR_INVALID, f"{what}: each {item} is in 0..2^{bits}-1")
        a = np.ascontiguousarray(a, dtype=np.uint64 if bits == 64 else np.uint32)
        return a.ctypes.data, a.shape[0], a
    seq = list(values)
    arr = (ctype * max(len(seq), 1))()
    for i, v in enumerate(seq):
        if not _is_int(v) or not 0 <= v < limit:
            raise make_error(Status.ERR_INVALID, f"{what}: entry {i} = {v!r} is not a {item} (0..2^{bits}-1)")
        arr[i] = int(v)
    return ctypes.addressof(arr), len(seq), arr


def _pool_list(pools, fn):
    """(pointer, count, keepalive) of a pool list; (None, 0, None) for None."""
    if pools is None:
        return None, 0, None
    return _uint_array(pools, f"{fn}: pools", bits=32, item="pool index")
