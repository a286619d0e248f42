"""Torch's own log lines while kernelgraft runs a reference under ``torch.compile`` (the
``torch:compile`` candidate, ``_compete.py``): graph-break warnings, a fake-tensor error logged
before Dynamo falls back. kernelgraft chose to compile the user's reference, so what Dynamo says
about it is kernelgraft's business: a failure reaches the user as kernelgraft's own warning
("torch:compile no longer competes: ..."), not as torch's ERROR lines about code they did not
compile. Only records emitted on the thread inside ``quiet()`` are dropped (a filter on the
handlers of torch's loggers, which do not propagate); CRITICAL ones still pass."""

from __future__ import annotations

import logging
import threading

__all__ = ["quiet"]

_local = threading.local()
_installed = [False]
_install_lock = threading.Lock()


class _Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_local, "depth", 0) or record.levelno >= logging.CRITICAL


_FILTER = _Filter()


def _install() -> None:
    with _install_lock:
        if _installed[0]:
            return
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch.")):
                for handler in logger.handlers:
                    if _FILTER not in handler.filters:
                        handler.addFilter(_FILTER)
        _installed[0] = True


class quiet:
    """Drop torch's log records below CRITICAL emitted on this thread inside the block."""

    __slots__ = ()

    def __enter__(self) -> None:
        if not _installed[0]:
            _install()
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1
