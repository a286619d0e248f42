"""Kernel specs: one small frozen class per backend, validated when created.

A spec says *how* to run a kernel (the backend, its launch function or source, the configs it may
take, when it applies); it holds no compiled state. Specs are hashable and carry a fingerprint,
a sha256 over everything that changes the generated code, stable across processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import SpecError

__all__ = ["Config", "ImplSpec", "normalize_capability", "callable_source", "source_of",
           "validate_launch_keywords"]

_CONFIG_VALUE_TYPES = (int, float, bool, str, type(None))


class Config(tuple):
    """A config as a sorted tuple of ``(key, value)`` pairs: hashable, ordered, compared by value."""

    __slots__ = ()

    @classmethod
    def of(cls, mapping: Mapping[str, Any], *, where: str) -> "Config":
        if isinstance(mapping, Config):
            return mapping
        if not isinstance(mapping, Mapping):
            raise SpecError(
                f"{where}: each config must be a dict of keyword arguments, got "
                f"{type(mapping).__name__} {mapping!r}; write configs=[{{'BLOCK': 256}}, ...]"
            )
        items = []
        for key, value in mapping.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise SpecError(f"{where}: config key {key!r} is not a valid keyword argument name")
            value = _freeze(value, where=f"{where}: config key {key!r}")
            items.append((key, value))
        return cls(sorted(items))

    def as_dict(self) -> dict[str, Any]:
        return dict(self)

    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self) or "-"

    def __repr__(self) -> str:
        return f"Config({self.as_dict()!r})"


def _freeze(value: Any, *, where: str) -> Any:
    if isinstance(value, _CONFIG_VALUE_TYPES):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v, where=where) for v in value)
    raise SpecError(
        f"{where}: value {value!r} of type {type(value).__name__} is not allowed; "
        "config values must be int, float, bool, str, None or tuples of these"
    )


def normalize_capability(value: Any, *, where: str) -> tuple[int, int] | None:
    """Accept 90, 9.0, (9, 0), "sm_90", "9.0" and return (9, 0)."""
    if value is None:
        return None
    try:
        if isinstance(value, tuple) and len(value) == 2:
            return int(value[0]), int(value[1])
        if isinstance(value, str):
            text = value.lower().removeprefix("sm_").rstrip("a")
            if "." in text:
                major, minor = text.split(".")
                return int(major), int(minor)
            value = int(text)
        if isinstance(value, float):
            major = int(value)
            return major, int(round((value - major) * 10))
        if isinstance(value, int) and value >= 10:
            return value // 10, value % 10
    except (TypeError, ValueError):
        pass
    raise SpecError(
        f"{where}: min_capability {value!r} is not a compute capability; "
        "write 90, (9, 0), 9.0 or 'sm_90'"
    )


def callable_source(fn: Callable) -> str:
    """Source text of ``fn`` plus what it names that changes what it computes, for fingerprints:
    the kernels it names and the JIT helpers they call, at any depth, and the plain values (numbers,
    strings, tuples of them) captured in its closure. A factory's ``eps`` captured in a closure or
    an edited ``@triton.jit`` helper is another op. Module globals are left out: a function reads
    them when it runs (an edited one takes effect without a new op), and one derived from the
    machine would give an op another identity on each."""
    parts = [source_of(fn)]
    _named_by(fn, parts, {id(fn)})
    return "\n".join(parts)


_MISSING = object()
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return len(value) <= 64 and all(_plain(v) for v in value)
    return isinstance(value, _PLAIN) and not (isinstance(value, (str, bytes)) and len(value) > 4096)


def _stable(value: Any) -> str:
    """``repr`` of a plain value, the same in every process (a frozenset's order follows the hash
    seed, so its items are sorted)."""
    if isinstance(value, frozenset):
        return f"frozenset({sorted(_stable(v) for v in value)})"
    if isinstance(value, tuple):
        return "(" + "".join(_stable(v) + ", " for v in value) + ")"
    return repr(value)


def _named_by(fn: Callable, parts: list[str], seen: set[int]) -> None:
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    namespace = getattr(fn, "__globals__", None) or {}
    closure: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            closure[name] = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later in the enclosing function)
            pass
    for name in sorted(set(code.co_names) | set(closure)):
        obj = closure.get(name, namespace.get(name, _MISSING))
        if obj is _MISSING or obj is fn:
            continue
        if name in closure and _plain(obj):
            parts.append(f"{name}={_stable(obj)}")
            continue
        inner = getattr(obj, "fn", None)  # triton JITFunction, cute kernels, ...
        if inner is not None and callable(inner) and id(inner) not in seen:
            seen.add(id(inner))
            parts.append(f"{name}:{source_of(inner)}")
            _named_by(inner, parts, seen)  # the helpers a kernel calls are its code too


def source_of(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # no source (a REPL, exec of a string): the code, constants and all
        code = getattr(fn, "__code__", None)
        name = getattr(fn, "__qualname__", repr(fn))
        return f"{name}:{_code_text(code) if code is not None else ''}"


def _code_text(code: Any) -> str:
    consts = [_code_text(c) if hasattr(c, "co_code") else _stable(c) if _plain(c) else type(c).__name__
              for c in code.co_consts]
    return f"{code.co_code.hex()}:{code.co_names}:{consts}"


def validate_launch_keywords(launch: Callable, configs: Sequence[Config], *, where: str) -> None:
    try:
        params = inspect.signature(launch).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = {
        n for n, p in params.items()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    required = {
        n for n, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    }
    for config in configs:
        keys = {k for k, _ in config}
        unknown = sorted(keys - accepted)
        if unknown:
            raise SpecError(
                f"{where}: config {config.as_dict()} has key {unknown[0]!r}, which "
                f"{getattr(launch, '__qualname__', launch)!r} does not take; it takes "
                f"{sorted(accepted)}"
            )
        missing = sorted(required - keys)
        if missing:
            raise SpecError(
                f"{where}: config {config.as_dict()} lacks {missing[0]!r}, a keyword-only argument of "
                f"{getattr(launch, '__qualname__', launch)!r} with no default"
            )


@dataclasses.dataclass(frozen=True, eq=False)
class ImplSpec:
    """Common fields of every backend's spec. Subclasses set ``backend`` and may add fields."""

    backend = "abstract"

    launch: Callable[..., Any] | None
    configs: tuple[Config, ...]
    supports: Callable[..., bool | str] | None = None
    min_capability: tuple[int, int] | None = None
    contiguous: bool | tuple[str, ...] = True
    name: str | None = None

    def __post_init__(self) -> None:
        where = f"kg.{self.backend}({self.display_name})"
        if self.launch is not None and not callable(self.launch):
            raise SpecError(f"{where}: launch must be callable, got {type(self.launch).__name__}")
        configs = self.configs
        if isinstance(configs, Mapping) or not isinstance(configs, Iterable):
            raise SpecError(
                f"{where}: configs must be a list of dicts, got {type(configs).__name__}; "
                "write configs=[{...}, {...}]"
            )
        frozen = tuple(Config.of(c, where=where) for c in configs)
        if not frozen:
            raise SpecError(f"{where}: configs is empty; give at least one config, e.g. [{{}}]")
        if len(set(frozen)) != len(frozen):
            raise SpecError(f"{where}: configs has duplicates: {[c.as_dict() for c in frozen]}")
        object.__setattr__(self, "configs", frozen)
        if self.launch is not None:
            validate_launch_keywords(self.launch, frozen, where=where)
        if self.supports is not None and not callable(self.supports):
            raise SpecError(f"{where}: supports must be callable, got {type(self.supports).__name__}")
        object.__setattr__(
            self, "min_capability", normalize_capability(self.min_capability, where=where)
        )
        contiguous = self.contiguous
        if not isinstance(contiguous, bool):
            if isinstance(contiguous, str):
                contiguous = (contiguous,)
            contiguous = tuple(contiguous)
            if not all(isinstance(c, str) for c in contiguous):
                raise SpecError(f"{where}: contiguous must be a bool or argument names")
            object.__setattr__(self, "contiguous", contiguous)
        self._validate()
        object.__setattr__(self, "_fingerprint", self._compute_fingerprint())

    # Subclasses add their own checks here.
    def _validate(self) -> None:
        pass

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        return getattr(self.launch, "__name__", None) or self.backend

    def code_identity(self) -> str:
        """Everything about the kernel's code that affects what gets compiled."""
        return callable_source(self.launch) if self.launch is not None else ""

    def _compute_fingerprint(self) -> str:
        payload = {
            "backend": self.backend,
            "code": self.code_identity(),
            "configs": [list(map(list, c)) for c in self.configs],
            "min_capability": self.min_capability,
            "contiguous": self.contiguous,
            "supports": callable_source(self.supports) if self.supports else None,
        }
        blob = json.dumps(payload, sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def fingerprint(self) -> str:
        return self._fingerprint  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.fingerprint))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.fingerprint == self.fingerprint  # type: ignore[attr-defined]

    def config(self, config: Mapping[str, Any] | int | Config) -> Config:
        """A config of this spec by index or value; any dict the launch accepts is allowed."""
        if isinstance(config, int) and not isinstance(config, bool):
            try:
                return self.configs[config]
            except IndexError:
                raise SpecError(
                    f"kg.{self.backend}({self.display_name}): config index {config} out of range; "
                    f"it has {len(self.configs)} configs"
                ) from None
        frozen = Config.of(config, where=f"kg.{self.backend}({self.display_name})")
        if self.launch is not None:
            validate_launch_keywords(self.launch, (frozen,), where=f"kg.{self.backend}({self.display_name})")
        return frozen

    def __repr__(self) -> str:
        return (
            f"kg.{self.backend}({self.display_name}, configs={[c.as_dict() for c in self.configs]})"
        )
