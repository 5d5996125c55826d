# SPDX-License-Identifier: Apache-2.0
"""The C enums, value for value (include/kvferry.h).

Each takes its member, its value, or its name as a string in any case, with
"-" for "_" (Backend("host"), CacheRemote("write-through")), so every
argument of an enum type accepts all three; anything else raises
InvalidArgument naming the valid names.
"""

from enum import IntEnum
from typing import Any, Optional, Union


class _Enum(IntEnum):
    @classmethod
    def _missing_(cls, value: Any) -> Optional["_Enum"]:
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper().replace("-", "_"))
            if member is not None:
                return member
        from ._errors import make_error  # _errors needs this module first

        names = ", ".join(repr(n.lower()) for n in cls.__members__)
        raise make_error(Status.ERR_INVALID, f"{value!r} is not a {cls.__name__}: valid are {names}, "
                         f"or {cls.__name__}.<NAME>, or the value")


class Status(_Enum):
    OK = 0
    INPROGRESS = 1
    ERR_INVALID = -1
    ERR_RANGE = -2
    ERR_UNSUPPORTED = -3
    ERR_STATE = -4
    ERR_UNKNOWN_TICKET = -5
    ERR_NOMEM = -10
    ERR_RESOURCE = -11
    ERR_NO_DEVICE = -20
    ERR_DEVICE = -21
    ERR_IO = -30
    ERR_NOT_FOUND = -31
    ERR_NO_SPACE = -32
    ERR_REMOTE = -40
    ERR_TIMEOUT = -41
    ERR_CORRUPT = -50
    ERR_MISMATCH = -51
    ERR_LOST = -52


class LogLevel(_Enum):
    """How much libkvferry logs (kvf_log_level): a line is produced when its
    level is not above the current one."""

    OFF = 0
    ERROR = 1
    WARN = 2
    INFO = 3
    DEBUG = 4
    TRACE = 5  # every round trip; very verbose


class SettingSource(_Enum):
    """Where an effective setting came from (kvf_setting_source)."""

    DEFAULT = 0
    FILE = 1  # the config file (Engine(config_file=...) or $KVF_CONFIG)
    ENV = 2  # its KVF_* environment variable
    CALLER = 3  # the keyword argument


class Dtype(_Enum):
    FP32 = 0
    FP16 = 1
    BF16 = 2
    FP8_E4M3 = 3
    FP8_E5M2 = 4
    INT8 = 5
    INT4 = 6
    FP4 = 7


class Order(_Enum):
    HEAD_MAJOR = 0  # [layers][kv][heads][tokens][head]
    TOKEN_MAJOR = 1  # [layers][kv][tokens][heads][head]


class Backend(_Enum):
    AUTO = 0
    HOST = 1
    CUDA = 2


class FileIO(_Enum):
    AUTO = 0
    POSIX = 1
    GDS = 2


class GdsCompat(_Enum):
    AUTO = 0  # file.io GDS: as cuFile is configured, where it takes file.dir's files; AUTO: only with P2P
    OFF = 1  # P2P only
    ON = 2  # cuFile's compatibility mode too


class FileRunner(_Enum):
    AUTO = 0  # io_uring where built and allowed, else threads
    URING = 1
    THREADS = 2


class Fsync(_Enum):
    BATCH = 0  # the default, 0 as every default of the config structs
    NONE = 1
    BLOCK = 2


class CudaCopy(_Enum):
    AUTO = 0
    KERNEL = 1
    DMA = 2


class Memory(_Enum):
    HOST = 0
    HOST_PINNED = 1
    DEVICE = 2


class Level(_Enum):
    PRIMARY = 0
    SECONDARY = 1


class Tier(_Enum):
    """Where a block is kept (kvf_tier). Engine moves go between the primary
    slots and HOST, DISK or REMOTE; a Cache keeps blocks in all four, falling
    through them GPU (when it owns GPU blocks), host, disk, remote."""

    HOST = 0  # the engine's secondary slots
    DISK = 1  # the engine's block files (Engine(file_dir=...))
    REMOTE = 2  # a Redis server or cluster (Engine(remote_url=...)), shared between engines
    GPU = 3  # primary slots a Cache allocates (Cache(gpu_blocks=...)); no Engine move takes it


class GdsState(_Enum):
    """What probing cuFile found (kvf_gds_state), worst to best."""

    ABSENT = 0  # no libcufile (or a build without CUDA)
    REFUSED = 1  # loaded, but its driver would not open, or no CUDA device to open it for
    COMPAT = 2  # open, no P2P path: cuFile's compatibility mode
    P2P = 3  # open, nvidia-fs loaded or P2P DMA offered


def status(value: int) -> Union[int, "Status"]:
    """value as a Status, or the plain int when this module does not know it."""
    try:
        return Status(value)
    except ValueError:
        return value


class DirEntryKind(_Enum):
    """What dir_check found under one name of a namespace (kvf_dir_entry_kind)."""

    GOOD = 0  # header, layout, namespace, length and checksum check
    CORRUPT = 1  # a block file whose bytes fail a check
    TORN = 2  # the temporary file of a write that did not finish
    MISMATCH = 3  # a sound block of another layout or namespace
    FOREIGN = 4  # not a regular file under a block's name (a FIFO, a directory, a link)
    UNREADABLE = 5  # the read failed for a reason that says nothing about the file: not checked
    OLD_FORMAT = 6  # a block of format version 1 (64-bit keys): never served; dir_upgrade rewrites it


class CacheRemote(_Enum):
    """How a Cache uses its engine's remote tier."""

    OFF = 0
    WRITE_THROUGH = 1  # puts are stored remotely too; lookups and gets fall back to it
    READ = 2  # lookups and gets fall back to it; puts leave it alone


class EventKind(_Enum):
    STORED = 0  # a block entered the cache (tier: where)
    UPDATED = 1  # a block moved down a tier (from_tier -> tier)
    REMOVED = 2  # a block left the cache (tier: the one it left)


# What an argument of each enum type accepts: the member, its value or its name.
DtypeLike = Union[Dtype, int, str]
OrderLike = Union[Order, int, str]
BackendLike = Union[Backend, int, str]
MemoryLike = Union[Memory, int, str]
LevelLike = Union[Level, int, str]
TierLike = Union[Tier, int, str]
CacheRemoteLike = Union[CacheRemote, int, str]
LogLevelLike = Union[LogLevel, int, str]
