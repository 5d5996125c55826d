# SPDX-License-Identifier: Apache-2.0
"""Python values into C fields and arguments, checked in one place.

ctypes keeps the low bits of an integer too large for its C type
(threads=2**40 became 0 threads) and hands C a string cut at its first NUL
('a\\x00/../../x' became 'a'). Every integer and string the binding gives
the library goes through c_int / c_string / fill here instead, so such a
value raises InvalidArgument (a ValueError) naming the argument.
"""

import ctypes
import numbers
import os
from typing import Iterable, Optional, Tuple

from ._enums import Status
from ._errors import make_error

# (low, high) of each integer ctype the binding uses, from its size and sign
_SIGNED = (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_int, ctypes.c_long,
           ctypes.c_longlong, ctypes.c_ssize_t)
_UNSIGNED = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint, ctypes.c_ulong,
             ctypes.c_ulonglong, ctypes.c_size_t)


def _bounds(ctype) -> Optional[Tuple[int, int]]:
    bits = 8 * ctypes.sizeof(ctype)
    if ctype in _UNSIGNED:
        return 0, 2**bits - 1
    if ctype in _SIGNED:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return None


def c_int(value, ctype, name: str) -> int:
    """value as an int that ctype holds exactly (an enum member counts as
    its value); else InvalidArgument naming `name` and the range."""
    lo, hi = _bounds(ctype)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise make_error(Status.ERR_INVALID, f"{name} = {value!r}: expected an integer")
    v = int(value)
    if not lo <= v <= hi:
        raise make_error(Status.ERR_INVALID, f"{name} = {v}: does not fit its C field ({lo} .. {hi})")
    return v


KEY_LIMIT = 2**128


def c_key(value, name: str):
    """value, an int in 0 .. 2**128-1, as a kvf_key (hi, lo); else
    InvalidArgument (a ValueError) naming `name`: a key is never cut to
    fit, as ctypes would cut an int to 64 bits."""
    from ._lib import Key_t

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise make_error(Status.ERR_INVALID, f"{name} = {value!r}: expected an integer block key")
    v = int(value)
    if not 0 <= v < KEY_LIMIT:
        raise make_error(Status.ERR_INVALID, f"{name} = {v}: a block key is in 0 .. 2**128-1")
    return Key_t(v >> 64, v & 0xFFFF_FFFF_FFFF_FFFF)


def key_int(key) -> int:
    """A kvf_key (hi, lo) as one Python int."""
    return int(key.hi) << 64 | int(key.lo)


def key_array(values, what: str):
    """(pointer, count, keepalive) of a kvf_key array from one int, a list
    of ints (each 0 .. 2**128-1), or a NumPy array: integers of up to 64
    bits (key {0, value} each), an array of shape (n, 2) of (hi, lo)
    halves, or an object array of Python ints. InvalidArgument names
    `what` and the entry for anything else."""
    from ._lib import Key_t

    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = [values]
    if type(values).__module__ == "numpy" and hasattr(values, "dtype"):
        import numpy as np

        a = values
        if np.issubdtype(a.dtype, np.integer):
            pairs = a.ndim == 2 and a.shape[1] == 2
            flat = a.reshape(-1)
            if flat.size and int(flat.min()) < 0:
                raise make_error(Status.ERR_INVALID, f"{what}: negative block key")
            if pairs:
                out = np.ascontiguousarray(a, dtype=np.uint64)
            else:
                out = np.zeros((flat.shape[0], 2), np.uint64)
                out[:, 1] = flat
            return out.ctypes.data, out.shape[0], out
        if a.dtype != object:
            raise make_error(Status.ERR_INVALID, f"{what}: an integer array is needed, not {a.dtype}")
        values = a.reshape(-1).tolist()
    seq = list(values)
    arr = (Key_t * max(len(seq), 1))()
    for i, v in enumerate(seq):
        arr[i] = c_key(v, f"{what}: key {i}")
    return ctypes.addressof(arr), len(seq), arr


def c_string(value, name: str, path: bool = False) -> Optional[bytes]:
    """value (None, str, bytes or an os.PathLike) as the bytes of a C
    string: a str in UTF-8 (path=True: the file system's encoding, as a
    PathLike always is); InvalidArgument naming `name` for anything else,
    or for a NUL inside, which C would read as the string's end."""
    if value is None:
        return None
    if path or isinstance(value, os.PathLike):
        try:
            b = os.fsencode(value)
        except TypeError:
            raise make_error(Status.ERR_INVALID, f"{name}: {value!r} is not a path") from None
    elif isinstance(value, str):
        b = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        b = bytes(value)
    else:
        raise make_error(Status.ERR_INVALID, f"{name}: {value!r} is not a string")
    if b"\0" in b:
        raise make_error(Status.ERR_INVALID, f"{name} = {value!r}: holds a NUL character, where C would end "
                                             f"the string")
    return b


def _field_type(struct, field: str):
    for fname, ftype, *_ in type(struct)._fields_:
        if fname == field:
            return ftype
    raise AttributeError(f"{type(struct).__name__} has no field {field}")


def fill(struct, values: Iterable[Tuple[str, str, object]]) -> list:
    """Sets struct's fields from (field, name, value) triples, field a
    dotted path into nested structs ("remote.timeout_ms"), each converted
    for its C type by c_int / c_string with `name` (the caller's argument)
    in the error. Returns the bytes objects the struct now points into,
    which the caller keeps alive as long as it uses the struct."""
    keep = []
    for field, name, value in values:
        target, *rest = field.split(".")
        owner = struct
        while rest:
            owner = getattr(owner, target)
            target, *rest = rest
        ctype = _field_type(owner, target)
        if ctype is ctypes.c_char_p:
            value = c_string(value, name)
            keep.append(value)
        elif _bounds(ctype) is not None:
            value = c_int(value, ctype, name)
        setattr(owner, target, value)
    return keep


__all__ = ["c_int", "c_key", "c_string", "fill", "key_array", "key_int", "KEY_LIMIT"]
