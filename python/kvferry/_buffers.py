# SPDX-License-Identifier: Apache-2.0
"""Caller memory for a pool: NumPy arrays, __array_interface__,
__cuda_array_interface__ and DLPack (__dlpack__) objects, without importing
any of the libraries that make them.

as_buffer(obj) returns a Buffer: the address, the byte size, where it lives
(host, pinned host, CUDA) and the owner to keep alive.
"""

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ._enums import Status
from ._errors import make_error

HOST = "host"
PINNED = "pinned"  # page-locked host memory (DLPack kDLCUDAHost)
CUDA = "cuda"


@dataclass
class Buffer:
    ptr: int
    nbytes: int
    kind: str  # HOST, PINNED or CUDA
    device: Optional[int]  # CUDA ordinal when known
    owner: Any  # the object whose memory this is
    keepalive: Any = None  # e.g. the DLPack capsule
    source: str = ""  # which protocol described it


def _fail(status, what, text):
    return make_error(status, f"{what}: {text}")


def _typestr_itemsize(typestr: str) -> int:
    # '<f4', '|u1', '<c16', '|V24', '<M8[ns]'
    digits = ""
    for ch in typestr[2:]:
        if not ch.isdigit():
            break
        digits += ch
    if not digits:
        raise ValueError(f"unknown typestr {typestr!r}")
    return int(digits)


def _check_c_contiguous(shape, strides, itemsize, what):
    """strides None means C-contiguous. Dimensions of extent 1 may have any stride."""
    if strides is None:
        return
    expected = itemsize
    for extent, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if extent != 1 and stride != expected:
            raise _fail(Status.ERR_INVALID, what,
                        f"memory is not C-contiguous (shape {tuple(shape)}, strides {tuple(strides)} bytes, "
                        f"item {itemsize} bytes); pass a contiguous array (e.g. .contiguous() / "
                        f"np.ascontiguousarray)")
        expected *= extent


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _from_interface(obj, iface, kind, what, source):
    ptr, readonly = iface["data"] if iface.get("data") is not None else (None, False)
    if ptr is None:
        raise _fail(Status.ERR_INVALID, what, f"{source} without a data pointer (a buffer-protocol export) is not supported")
    if readonly:
        raise _fail(Status.ERR_INVALID, what, "memory is read-only; kvferry writes pool slots")
    if iface.get("mask") is not None:
        raise _fail(Status.ERR_INVALID, what, "masked arrays are not supported")
    shape = tuple(iface["shape"])
    itemsize = _typestr_itemsize(iface["typestr"])
    _check_c_contiguous(shape, iface.get("strides"), itemsize, what)
    off = int(iface.get("offset", 0) or 0)
    return Buffer(int(ptr) + off, _prod(shape) * itemsize, kind, None, obj, None, source)


# ---- DLPack ----------------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DL_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
             10: "ROCM", 11: "ROCMHost", 13: "CUDAManaged", 14: "OneAPI", 15: "WebGPU", 16: "Hexagon"}

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, what):
    try:
        capsule = obj.__dlpack__()
    except TypeError:
        capsule = obj.__dlpack__(stream=None)
    except Exception as exc:
        raise _fail(Status.ERR_INVALID, what, f"__dlpack__() failed: {exc}") from exc
    if not _capsule_is_valid(capsule, b"dltensor"):
        raise _fail(Status.ERR_INVALID, what, "__dlpack__() did not return a 'dltensor' capsule")
    # The capsule stays unconsumed (its name unchanged) and referenced by the
    # Buffer: its destructor calls the producer's deleter once we drop it.
    mt = _DLManagedTensor.from_address(_capsule_get(capsule, b"dltensor"))
    t = mt.dl_tensor
    dev = t.device.device_type
    if dev == _kDLCPU:
        kind = HOST
    elif dev == _kDLCUDAHost:
        kind = PINNED
    elif dev in (_kDLCUDA, _kDLCUDAManaged):
        kind = CUDA
    else:
        raise _fail(Status.ERR_UNSUPPORTED, what,
                    f"DLPack device {_DL_NAMES.get(dev, dev)} is neither host nor CUDA memory")
    ndim = t.ndim
    shape = [t.shape[i] for i in range(ndim)]
    bits = t.dtype.bits * t.dtype.lanes
    if t.strides:
        strides_el = [t.strides[i] for i in range(ndim)]
        if bits % 8:
            # sub-byte elements: contiguity in elements
            expected = 1
            for extent, stride in zip(reversed(shape), reversed(strides_el)):
                if extent != 1 and stride != expected:
                    raise _fail(Status.ERR_INVALID, what, f"memory is not C-contiguous (shape {tuple(shape)}, "
                                f"strides {tuple(strides_el)} elements)")
                expected *= extent
        else:
            _check_c_contiguous(shape, [s * (bits // 8) for s in strides_el], bits // 8, what)
    nbytes = (_prod(shape) * bits + 7) // 8
    ptr = (t.data or 0) + t.byte_offset
    return Buffer(ptr, nbytes, kind, t.device.device_id if kind == CUDA else None, obj, capsule, "__dlpack__")


def _cai(obj):
    try:
        return obj.__cuda_array_interface__
    except AttributeError:  # e.g. torch's property on a CPU tensor
        return None
    except Exception:
        return None


def as_buffer(obj, what="buffer") -> Buffer:
    """Describes obj's memory. Order: __cuda_array_interface__,
    __array_interface__, __dlpack__, then a writable buffer-protocol object."""
    if isinstance(obj, Buffer):
        return obj
    iface = _cai(obj)
    if iface is not None:
        buf = _from_interface(obj, iface, CUDA, what, "__cuda_array_interface__")
        return buf
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        return _from_interface(obj, iface, HOST, what, "__array_interface__")
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, what)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise _fail(Status.ERR_INVALID, what,
                    f"{type(obj).__name__} is not an array: pass a NumPy array, an object with "
                    f"__array_interface__ / __cuda_array_interface__, or a DLPack tensor (__dlpack__)") from None
    if mv.readonly:
        raise _fail(Status.ERR_INVALID, what, "memory is read-only; kvferry writes pool slots")
    if not mv.c_contiguous:
        raise _fail(Status.ERR_INVALID, what, "memory is not C-contiguous")
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if mv.nbytes else 0
    return Buffer(ptr, mv.nbytes, HOST, None, (obj, mv), None, "buffer protocol")
