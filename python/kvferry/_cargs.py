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


__all__ = ["c_int", "c_string", "fill"]
