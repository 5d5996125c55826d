# SPDX-License-Identifier: Apache-2.0
"""libkvferry's log lines into Python's logging module.

    import logging, kvferry
    logging.basicConfig(level=logging.INFO)
    kvferry.install_log_handler(level="info")   # lines to logging.getLogger("kvferry")
"""

import atexit
import logging
import threading
from typing import Optional

from . import _lib
from ._enums import LogLevel, LogLevelLike
from ._errors import check

L = _lib.lib

TRACE = 5  # logging has no level below DEBUG; kvferry's trace lines get this one
LOGGER_NAME = "kvferry"

_PY_LEVELS = {LogLevel.ERROR: logging.ERROR, LogLevel.WARN: logging.WARNING, LogLevel.INFO: logging.INFO,
              LogLevel.DEBUG: logging.DEBUG, LogLevel.TRACE: TRACE}

_lock = threading.Lock()
# The installed ctypes callback. C holds only its address: dropping this
# reference while C may still call it would free the trampoline under it.
_callback = None


def _forward(_user, level, line):
    try:
        logging.getLogger(LOGGER_NAME).log(_PY_LEVELS.get(level, logging.WARNING), "%s",
                                           (line or b"").decode("utf-8", "replace"))
    except BaseException:  # never unwind into C; logging reports its own handlers' errors
        pass


def set_log_level(level: LogLevelLike) -> None:
    """Sets which lines libkvferry produces, for the whole process
    (kvf_log_set_level; overrides KVF_LOG). Python's logger levels filter
    further what reaches its handlers."""
    check(L.kvf_log_set_level(int(LogLevel(level))))


def get_log_level() -> LogLevel:
    """The level libkvferry logs at (KVF_LOG, else warn, or set_log_level's)."""
    return LogLevel(L.kvf_log_get_level())


def install_log_handler(level: Optional[LogLevelLike] = None) -> logging.Logger:
    """Sends libkvferry's log lines to the logger "kvferry" instead of
    stderr (or KVF_LOG_FILE), and returns that logger. Levels map error ->
    ERROR, warn -> WARNING, info -> INFO, debug -> DEBUG, trace -> 5.

    Which lines the library produces is its own level (KVF_LOG, default
    warn), set here too when `level` is given (set_log_level). Lines come
    from kvferry's worker threads as well as the caller's, one at a time;
    repeated warnings are rate-limited in the library. Installing again is
    harmless; remove_log_handler() restores the default sink, as does the
    interpreter's exit."""
    global _callback
    with _lock:
        if _callback is None:
            cb = _lib.LogFn(_forward)
            L.kvf_log_set_handler(cb, None)
            _callback = cb
            atexit.register(remove_log_handler)
    if level is not None:
        set_log_level(level)
    return logging.getLogger(LOGGER_NAME)


def remove_log_handler() -> None:
    """Restores libkvferry's default sink (stderr, or KVF_LOG_FILE). Once it
    returns, the Python handler is not called again. Idempotent."""
    global _callback
    with _lock:
        if _callback is None:
            return
        L.kvf_log_set_handler(_lib.LogFn(), None)  # NULL; C stops calling before this returns
        _callback = None
        atexit.unregister(remove_log_handler)
