# SPDX-License-Identifier: Apache-2.0
"""A block directory and a remote store looked at without an engine
(kvf_dir_check, kvf_dir_list, kvf_dir_upgrade, kvf_dir_namespaces,
kvf_remote_probe): what
`kvferry fsck` and `kvferry info` report, from Python.

    r = kvf.dir_check("/mnt/nvme/kv", "rank0", geometries=[g] * 64)
    if r.problems:                       # every entry that is not GOOD
        print(r.counts, r.problems[0].message)
    blocks = kvf.dir_list("/mnt/nvme/kv", "rank0")          # what a cache would find
    kvf.remote_probe("redis://cache:6379/0")                # "redis 10.0.0.7:6379 db 0"

They may run while engines write the same directory. A block removed
meanwhile is skipped; one being written shows as its temporary file (TORN).
"""

import ctypes
import os
from typing import Callable, List, NamedTuple, Optional, Sequence, Union

from . import _lib
from ._cargs import c_int, c_string, key_int
from ._geometry import Geometry
from ._enums import DirEntryKind, Status, status
from ._errors import check, make_error

L = _lib.lib
PathLike = Union[str, bytes, "os.PathLike[str]"]


class DirEntry(NamedTuple):
    """One name of a namespace as dir_check found it (kvf_dir_entry).
    Decide on `kind`, never on `message`."""

    key: int  # the block's key (a torn file's: the block it was for)
    kind: DirEntryKind
    status: Union[Status, int]  # OK when GOOD, else the read's status
    message: str  # "ok", or what is wrong, naming the key and the file
    tokens: int  # GOOD only: tokens stored
    pools: int  # GOOD only: pools in the block
    payload_bytes: int  # GOOD only: bytes after the 64-byte header


class DirCounts(NamedTuple):
    """Entries of each kind (kvf_dir_counts)."""

    good: int = 0
    corrupt: int = 0
    torn: int = 0
    mismatch: int = 0
    foreign: int = 0
    unreadable: int = 0
    old_format: int = 0  # blocks of format version 1 (dir_upgrade)
    upgraded: int = 0  # dir_upgrade: version-1 blocks rewritten


class DirCheck(NamedTuple):
    """dir_check's answer: the counts of every kind, and the entries that
    are not GOOD, in directory order."""

    counts: DirCounts
    problems: List[DirEntry]


class DirBlock(NamedTuple):
    """A usable block as dir_list found it (kvf_dir_block)."""

    key: int
    tokens: int
    pools: int
    payload_bytes: int  # bytes after the 64-byte header
    mtime_ns: int  # when it was written: CLOCK_REALTIME, nanoseconds


def _path(value: PathLike, what: str) -> bytes:
    return c_string(value, f"{what}: dir", path=True)


def _namespace(ns: str) -> bytes:
    if not isinstance(ns, str):
        raise make_error(Status.ERR_INVALID, f"namespace: {ns!r} is not a string")
    return c_string(ns, "namespace")


def _geometries(geometries: Optional[Union[Geometry, Sequence[Geometry]]]):
    """(array, count) for the C call: None, one Geometry, or one per pool."""
    if geometries is None:
        return None, 0
    gs = [geometries] if isinstance(geometries, Geometry) else list(geometries)
    if not gs or not all(isinstance(g, Geometry) for g in gs):
        raise make_error(Status.ERR_INVALID, "geometries: expected a Geometry or a non-empty sequence of them "
                                             "(the engine's pools, in order)")
    return (_lib.Geometry_t * len(gs))(*(g._c() for g in gs)), len(gs)


class _Callback:
    """Keeps the first exception a callback raised, for the caller to
    re-raise once the C call returns (ctypes would print and drop it)."""

    def __init__(self):
        self.error: Optional[BaseException] = None

    def guard(self, fn: Callable, *args) -> None:
        if self.error is not None:
            return
        try:
            fn(*args)
        except BaseException as exc:  # re-raised by done()
            self.error = exc

    def done(self, st: int) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        check(st)


def dir_check(dir: PathLike, namespace: str = "default",
              geometries: Optional[Union[Geometry, Sequence[Geometry]]] = None,
              visit: Optional[Callable[[DirEntry], None]] = None) -> DirCheck:
    """Checks every block of <dir>/<namespace> as a read would (header,
    namespace, key, length, checksum of the whole payload; the layout when
    `geometries`, the engine's pools in order, are given), reading each
    block in full. visit(entry), when given, is called for every entry,
    GOOD ones included. Raises NotFound when <dir>/<namespace> is not a
    directory, InvalidArgument for a bad namespace or geometry; the
    verdicts themselves are in the answer, not raised."""
    arr, n = _geometries(geometries)
    cb, problems = _Callback(), []

    def entry(_arg, p):
        e = p.contents
        d = DirEntry(key_int(e.key), DirEntryKind(e.kind), status(e.status),
                     (e.message or b"").decode("utf-8", "replace"), int(e.tokens), int(e.pools),
                     int(e.payload_bytes))
        if d.kind != DirEntryKind.GOOD:
            problems.append(d)
        if visit is not None:
            visit(d)

    fn = _lib.DirCheckFn(lambda arg, p: cb.guard(entry, arg, p))
    counts = _lib.DirCounts_t()
    cb.done(L.kvf_dir_check(_path(dir, "dir_check"), _namespace(namespace), arr, n, fn, None,
                            ctypes.byref(counts)))
    return DirCheck(DirCounts(*(int(getattr(counts, f)) for f in DirCounts._fields)), problems)


def dir_list(dir: PathLike, namespace: str = "default",
             geometries: Optional[Union[Geometry, Sequence[Geometry]]] = None) -> List[DirBlock]:
    """The blocks of <dir>/<namespace> whose headers check (namespace, key,
    length, and the layout of `geometries` when given): what a cache opened
    on the directory would find, in directory order. Reads headers only: a
    damaged payload is not noticed here (dir_check finds it)."""
    arr, n = _geometries(geometries)
    cb, out = _Callback(), []

    def block(_arg, p):
        b = p.contents
        out.append(DirBlock(key_int(b.key), int(b.tokens), int(b.pools), int(b.payload_bytes), int(b.mtime_ns)))

    fn = _lib.DirListFn(lambda arg, p: cb.guard(block, arg, p))
    cb.done(L.kvf_dir_list(_path(dir, "dir_list"), _namespace(namespace), arr, n, fn, None, None))
    return out


def dir_upgrade(dir: PathLike, namespace: str = "default",
                visit: Optional[Callable[[DirEntry], None]] = None) -> DirCheck:
    """Rewrites the blocks of format version 1 (64-bit keys) in
    <dir>/<namespace> in the current format under their 128-bit names (the
    key zero-extended), file by file and atomically (kvf_dir_upgrade,
    `kvferry fsck --upgrade`). Each old file is checked whole first: a
    damaged one is reported (its entry in .problems) and left. visit(entry)
    is called for every old file, status OK once rewritten. .counts.upgraded
    counts the rewritten ones."""
    cb, problems = _Callback(), []

    def entry(_arg, p):
        e = p.contents
        d = DirEntry(key_int(e.key), DirEntryKind(e.kind), status(e.status),
                     (e.message or b"").decode("utf-8", "replace"), 0, 0, 0)
        if d.status != Status.OK:
            problems.append(d)
        if visit is not None:
            visit(d)

    fn = _lib.DirCheckFn(lambda arg, p: cb.guard(entry, arg, p))
    counts = _lib.DirCounts_t()
    cb.done(L.kvf_dir_upgrade(_path(dir, "dir_upgrade"), _namespace(namespace), fn, None, ctypes.byref(counts)))
    return DirCheck(DirCounts(*(int(getattr(counts, f)) for f in DirCounts._fields)), problems)


def dir_namespaces(dir: PathLike) -> List[str]:
    """The namespaces of a block directory (its subdirectories whose names
    are valid namespaces), in byte order."""
    cb, out = _Callback(), []
    fn = _lib.DirNamespaceFn(lambda arg, ns: cb.guard(out.append, ns.decode("utf-8", "replace")))
    cb.done(L.kvf_dir_namespaces(_path(dir, "dir_namespaces"), fn, None, None))
    return out


def remote_probe(url: Optional[str] = None, timeout_ms: int = 0) -> str:
    """Connects to a remote store, authenticates and pings it (every node
    serving slots, for a cluster), then disconnects; returns what answered
    ("redis 10.0.0.1:6379 db 0", never the password). url None:
    $KVF_REMOTE_URL. timeout_ms: per connect and command (0: 1000). Raises
    NotFound with no URL, Unsupported in a build without the Redis client,
    InvalidArgument for a bad URL, RemoteFailure or Timeout when a node
    cannot be reached or refuses."""
    if url is not None and not isinstance(url, str):
        raise make_error(Status.ERR_INVALID, f"remote_probe: url {url!r} is not a string")
    timeout_ms = c_int(timeout_ms, ctypes.c_uint32, "remote_probe: timeout_ms")
    detail = ctypes.create_string_buffer(512)
    check(L.kvf_remote_probe(c_string(url, "remote_probe: url"), timeout_ms, detail, len(detail)))
    return detail.value.decode("utf-8", "replace")
