# SPDX-License-Identifier: Apache-2.0
"""CUDA streams handed to the C API: torch's, an object's, or an int cudaStream_t."""

from ._moves import _is_int


# cudaStreamLegacy: CUDA's default stream named explicitly, where kvferry's
# C API takes NULL for "no stream" (a host wait)
_CUDA_STREAM_LEGACY = 1


def _stream_handle(stream, fn="sync_stream"):
    """The cudaStream_t of `stream` for the C API: None stays None (no
    stream); a stream object whose handle is 0 (torch's default stream) is
    CUDA's legacy default stream, passed as cudaStreamLegacy; an int is
    taken as it is, 0 meaning None."""
    if stream is None:
        return None
    if _is_int(stream):
        return int(stream) or None
    proto = getattr(stream, "__cuda_stream__", None)
    if callable(proto):
        return int(proto()[1]) or _CUDA_STREAM_LEGACY
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle) or _CUDA_STREAM_LEGACY
    raise TypeError(f"{fn}: expected None, an int cudaStream_t or an object with .cuda_stream, "
                    f"not {type(stream).__name__}")


def _torch_stream():
    """torch's current CUDA stream where torch is loaded and has CUDA, else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_stream().cuda_stream) or _CUDA_STREAM_LEGACY
