# SPDX-License-Identifier: Apache-2.0
"""KvferryError and its subclasses, one per kvf_status, grouped as the header groups them.

    KvferryError
    +-- UsageError        InvalidArgument, OutOfRange, Unsupported, InvalidState, UnknownTicket
    +-- OutOfMemory       (also a MemoryError)
    +-- OutOfResource     (file descriptors, threads: the block is intact, retry later)
    +-- DeviceError       NoDevice, DeviceFailure
    +-- FileError         IOFailure, NotFound, NoSpace
    +-- RemoteError       RemoteFailure, Timeout
    +-- IntegrityError    Corrupt, Mismatch, Lost

Each carries .status (the int code), .name (e.g. "ERR_NOT_FOUND") and
.message (kvf_last_error(), naming the pool, slot, block or file). One
raised for a batch (Ticket.wait(check=True)) is the first failed move's
class and also carries .failures: a MoveError per failed move.
"""

from typing import NamedTuple, Tuple

from . import _lib
from ._enums import Status


class MoveError(NamedTuple):
    """Why one move of a batch (or block of a cache call) failed
    (kvf_move_error): its index in the batch, its status, and the message
    captured where it failed (block key, slot, file path or node, reason)."""

    index: int
    status: Status
    message: str


class KvferryError(Exception):
    """A kvferry call failed."""

    def __init__(self, status: int, message: str = ""):
        self.status = int(status)
        try:
            self.name = Status(self.status).name
        except ValueError:
            self.name = f"status {self.status}"
        self.message = message or _lib.status_str(self.status)
        self.failures: Tuple[MoveError, ...] = ()
        super().__init__(f"{self.message} [{self.name}]")

    def __reduce__(self):
        return (type(self), (self.status, self.message))


class UsageError(KvferryError):
    """The caller's arguments or the order of calls (-1 .. -9)."""


class InvalidArgument(UsageError, ValueError):
    """KVF_ERR_INVALID: a NULL, a zero or a contradictory field."""


class OutOfRange(UsageError, ValueError):
    """KVF_ERR_RANGE: slot, pool, token count or size out of range."""


class Unsupported(UsageError):
    """KVF_ERR_UNSUPPORTED: valid, but this build or backend cannot do it."""


class InvalidState(UsageError):
    """KVF_ERR_STATE: not now, e.g. a pool added after transfers."""


class UnknownTicket(UsageError):
    """KVF_ERR_UNKNOWN_TICKET: never issued, or already retired."""


class OutOfMemory(KvferryError, MemoryError):
    """KVF_ERR_NOMEM."""


class OutOfResource(KvferryError):
    """KVF_ERR_RESOURCE: the process is out of file descriptors, threads or
    buffers. The stored block is intact and stays cached: recompute it now,
    or retry once the resource is free."""


class DeviceError(KvferryError):
    """GPU errors (-20 .. -29)."""


class NoDevice(DeviceError):
    """KVF_ERR_NO_DEVICE: no GPU, no driver, or a build without CUDA."""


class DeviceFailure(DeviceError):
    """KVF_ERR_DEVICE: a CUDA call failed."""


class FileError(KvferryError):
    """File tier errors (-30 .. -39)."""


class IOFailure(FileError):
    """KVF_ERR_IO: a system call on a file failed."""


class NotFound(FileError, LookupError):
    """KVF_ERR_NOT_FOUND: no stored block under that key or slot."""


class NoSpace(FileError):
    """KVF_ERR_NO_SPACE: ENOSPC or EDQUOT."""


class RemoteError(KvferryError):
    """Remote store errors (-40 .. -49; reserved)."""


class RemoteFailure(RemoteError):
    """KVF_ERR_REMOTE."""


class Timeout(RemoteError):
    """KVF_ERR_TIMEOUT."""


class IntegrityError(KvferryError):
    """kvferry refuses to hand back these bytes (-50 .. -59)."""


class Corrupt(IntegrityError):
    """KVF_ERR_CORRUPT: a stored block fails its header or checksum."""


class Mismatch(IntegrityError):
    """KVF_ERR_MISMATCH: a stored block has another layout or namespace."""


class Lost(IntegrityError):
    """KVF_ERR_LOST: the move this one depends on failed."""


_BY_STATUS = {
    Status.ERR_INVALID: InvalidArgument,
    Status.ERR_RANGE: OutOfRange,
    Status.ERR_UNSUPPORTED: Unsupported,
    Status.ERR_STATE: InvalidState,
    Status.ERR_UNKNOWN_TICKET: UnknownTicket,
    Status.ERR_NOMEM: OutOfMemory,
    Status.ERR_RESOURCE: OutOfResource,
    Status.ERR_NO_DEVICE: NoDevice,
    Status.ERR_DEVICE: DeviceFailure,
    Status.ERR_IO: IOFailure,
    Status.ERR_NOT_FOUND: NotFound,
    Status.ERR_NO_SPACE: NoSpace,
    Status.ERR_REMOTE: RemoteFailure,
    Status.ERR_TIMEOUT: Timeout,
    Status.ERR_CORRUPT: Corrupt,
    Status.ERR_MISMATCH: Mismatch,
    Status.ERR_LOST: Lost,
}

_BY_GROUP = {0: UsageError, 1: OutOfMemory, 2: DeviceError, 3: FileError, 4: RemoteError,
             5: IntegrityError}


for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, KvferryError):
        _cls.__module__ = "kvferry"


def error_class(status: int) -> type:
    """The exception class for a status: its own, or its group's for a code
    this module does not know yet (KvferryError outside every group)."""
    status = int(status)
    cls = _BY_STATUS.get(status)
    if cls is None and status < 0:
        cls = _BY_GROUP.get((-status) // 10)
    return cls or KvferryError


def make_error(status: int, message: str = None) -> KvferryError:
    """The exception for a status; message defaults to kvf_last_error()."""
    if message is None:
        message = _lib.last_error()
    return error_class(status)(status, message)


def check(status: int) -> int:
    """Raises for a negative status; returns it otherwise."""
    if status < 0:
        raise make_error(status)
    return status
