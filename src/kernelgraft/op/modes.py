"""When to tune: ``KERNELGRAFT_TUNE=on|cached|off`` and the ``kg.tune(...)`` context.

- ``on`` (default): a new key is measured on first use, then cached in memory and on disk.
- ``cached``: decisions from the cache are used; a key without one runs the default candidate
  (the first supported) and is not measured.
- ``off``: always the default candidate; the cache is not read.

``kg.tune(...)`` overrides the environment inside a ``with`` block or a decorated function, for
the current thread (and asyncio task: the settings live in a context variable), so a request
handler decorated with ``@kg.tune("off")`` does not change what another thread sees. Ops keep one
plan table per settings value (a ``Scope``): entering or leaving a block discards nothing, and a
call made under ``kg.tune("off")`` never reuses a plan tuned under ``on`` or the other way round.
Plans made outside any block follow the environment as it was when they were made
(``kg.tune.clear()`` makes ops choose again after changing it). While ``torch.compile``
traces or a CUDA graph is being captured nothing is measured: the cache or the default is used and
one warning says so.

``blocking`` (``kg.tune(blocking=...)``, ``KERNELGRAFT_TUNE_BLOCKING``): where a new key is tuned.
None (the default): on CUDA tensors off the caller's path: the call is served at once by a
provisional choice (the nearest tuned bucket's winner, else the reference) while a background
worker tunes the key, and the decision swaps in when it lands (``kernelgraft.tune.background``);
elsewhere (a test's injected timer on CPU tensors) on the caller's thread. True (``=1``): always on
the caller's thread, inside the first call, as benchmarks and warm-up scripts want (``kg.tune.pretune``
and ``kernelgraft tune`` always tune so). False (``=0``): off the path on every device.
``kg.tune.wait()`` waits for the background tunings.

``compete`` (``kg.tune(compete=...)``, ``KERNELGRAFT_COMPETE``): whether the op's reference, eager
and under ``torch.compile``, competes with the kernels (``kernelgraft.op.compete``). None (the
default): on CUDA tensors; False (``KERNELGRAFT_COMPETE=0``): never; True (``=1``): also on other
devices (with an injected timer: the CPU tests).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import SpecError, TuneWarning

__all__ = ["Settings", "Scope", "settings", "scope", "tune", "no_tune_reason", "MODES"]

MODES = ("on", "cached", "off")


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "on", "true", "yes")


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that shapes how a key is tuned. ``timer`` is for tests (fake timings)."""

    mode: str = "on"
    prune: bool = False
    max_candidates: int | None = None
    budget_s: float = 60.0  # per key, compile time included
    warmup: int = 3
    repeats: int = 50
    graph: bool = True
    cold_l2: bool = False
    isolate: bool = False
    distributed: bool = True
    progress: bool = True
    compete: bool | None = None  # None: PyTorch competes on CUDA tensors; False: never; True: always
    timer: Callable[..., float] | None = None
    blocking: bool | None = None  # None: off the caller's path on CUDA tensors; True: never; False: always

    def __post_init__(self) -> None:
        # Settings are interned by equality, and 0 == False hashes alike: Settings(compete=0)
        # would be the scope of compete=False while code testing ``is False`` reads it as unset.
        for name in ("compete", "blocking"):
            value = getattr(self, name)
            if not (type(value) is bool or value is None):
                raise SpecError(f"kernelgraft tune settings: {name} must be True, False or None, "
                                f"got {type(value).__name__} {value!r}")


def env_tristate(name: str) -> bool | None:
    """True/False for 1/on/true/yes and 0/off/false/no; None when unset (or unreadable, warned)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in ("1", "on", "true", "yes"):
        return True
    if text in ("0", "off", "false", "no"):
        return False
    warnings.warn(f"{name}={text!r} is not 0 or 1; using the default", TuneWarning, stacklevel=4)
    return None


def _from_env() -> Settings:
    mode = os.environ.get("KERNELGRAFT_TUNE", "on").strip().lower() or "on"
    if mode not in MODES:
        warnings.warn(f"KERNELGRAFT_TUNE={mode!r} is not one of {MODES}; using 'on'", TuneWarning, stacklevel=3)
        mode = "on"
    return Settings(
        mode=mode,
        prune=_env_bool("KERNELGRAFT_PRUNE"),
        max_candidates=_env_int("KERNELGRAFT_MAX_CANDIDATES"),
        budget_s=_env_float("KERNELGRAFT_TUNE_BUDGET", 60.0),
        cold_l2=_env_bool("KERNELGRAFT_TUNE_COLD_L2"),
        isolate=_env_bool("KERNELGRAFT_TUNE_ISOLATE"),
        compete=env_tristate("KERNELGRAFT_COMPETE"),
        blocking=env_tristate("KERNELGRAFT_TUNE_BLOCKING"),
    )


class Scope:
    """One settings value, interned: ops key their plan tables by it (identity hash, cheap)."""

    __slots__ = ("settings", "__weakref__")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"Scope({self.settings!r})"


_MAX_SCOPES = 256  # distinct settings values kept interned (a fake timer per test makes new ones)
_scopes: dict[Settings, Scope] = {}
_lock = threading.Lock()
# The innermost kg.tune block of this thread/task; None: the environment's settings.
_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("kernelgraft_tune", default=None)
scope = _current.get  # the hot path reads this: None, or the Scope of the innermost block
# The scopes the open blocks of this thread/task replaced, innermost last: a block restores what
# was current when it was entered. Kept in the context, not on the tune object, so one object
# entered by several threads or tasks at once (a module-level NO_TUNE = kg.tune("off")) is fine.
_outer: contextvars.ContextVar[tuple] = contextvars.ContextVar("kernelgraft_tune_outer", default=())


def _intern(value: Settings) -> Scope:
    found = _scopes.get(value)
    if found is None:
        with _lock:
            found = _scopes.get(value)
            if found is None:
                if len(_scopes) >= _MAX_SCOPES:
                    _scopes.clear()  # old Scope objects stay valid for whoever holds them
                found = _scopes[value] = Scope(value)
    return found


def settings() -> Settings:
    """The settings in force: this thread's innermost ``kg.tune`` block, else the environment."""
    current = _current.get()
    if current is not None:
        return current.settings
    return _from_env()


class tune(contextlib.ContextDecorator):
    """Tuning settings for a block or a function; also ``kernelgraft.tune`` called directly.

    >>> import kernelgraft as kg
    >>> with kg.tune("off"):
    ...     kg.tune.settings().mode
    'off'
    """

    def __init__(self, mode: str | None = None, /, **options: Any) -> None:
        if mode is not None and mode not in MODES:
            raise SpecError(f"kg.tune: mode must be one of {MODES}, got {mode!r}")
        if "budget" in options:
            options["budget_s"] = options.pop("budget")
        names = {f.name for f in dataclasses.fields(Settings)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise SpecError(f"kg.tune: unknown option {unknown[0]!r}; options are {sorted(names - {'mode'})}")
        compete = options.get("compete", None)
        if not (type(compete) is bool or compete is None):  # 0 == False: an int must not pass
            raise SpecError(f"kg.tune: compete must be True, False or None (the default: on CUDA), got "
                            f"{type(compete).__name__} {compete!r}; to keep one PyTorch candidate use kg.op(..., compete=('eager',))")
        blocking = options.get("blocking", None)
        if not (type(blocking) is bool or blocking is None):
            raise SpecError(f"kg.tune: blocking must be True (tune inside the first call), False (off the "
                            f"caller's path) or None (the default: off the path on CUDA), got "
                            f"{type(blocking).__name__} {blocking!r}")
        self._mode = mode
        self._options = options

    def __enter__(self) -> Settings:
        changes = dict(self._options)
        if self._mode is not None:
            changes["mode"] = self._mode
        now = dataclasses.replace(settings(), **changes)
        _outer.set(_outer.get() + (_current.get(),))
        _current.set(_intern(now))
        return now

    def __exit__(self, *exc: Any) -> None:
        outer = _outer.get()
        _current.set(outer[-1])
        _outer.set(outer[:-1])


_warned: set[str] = set()


def no_tune_reason() -> str | None:
    """Why measuring is not allowed right now (tracing or capture), else None."""
    try:
        if torch.compiler.is_compiling():
            return "torch.compile is tracing"
    except Exception:  # pragma: no cover - very old torch
        pass
    try:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "a CUDA graph is being captured"
    except Exception:
        pass
    return None


def warn_no_tune(op_name: str, reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"{op_name}: not tuning while {reason}; using the tuning cache or the default candidate. "
            "Call the op once before capturing/compiling (or run `kernelgraft tune`) to tune it.",
            TuneWarning,
            stacklevel=6,
        )
