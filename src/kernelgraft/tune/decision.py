"""A key's decision as the tuner keeps it in memory and in tune.json: the candidates that passed,
fastest first, the ones excluded and why, where the seconds went; and how a stored one is read back
(an entry this version cannot serve is a clean miss, whoever wrote it)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..op.compete import TORCH, TORCH_INDEX
from ..spec import Config

__all__ = ["Decision", "entry_label"]


@dataclasses.dataclass
class Decision:
    """A key's outcome. ``ranking``: passing candidates, fastest first; ``excluded``: the others
    with why. An empty ranking with nothing excluded means 'use the default candidate'."""

    key: dict[str, Any]
    ranking: list[dict[str, Any]]
    excluded: list[dict[str, Any]]
    source: str = "tuned"  # tuned | disk | rank | default
    created: float = dataclasses.field(default_factory=time.time)
    tune_s: float = 0.0
    measured: int = 0
    offered: int = 0
    provisional: bool = False  # made short of memory: serves this process, never saved
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds by phase (_phases)
    spent: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # label -> seconds by phase
    failure: str | None = None  # why the tuning failed (a default decision made by a failure)
    # A first decision off the caller's path (``offpath._land_first``): the Pending of its whole
    # tuning. Not a field: never saved, never sent to another rank.
    refining = None

    @property
    def partial(self) -> bool:
        """A first decision whose whole tuning has not landed yet."""
        return self.refining is not None and not self.refining.landed

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        if data["failure"] is None:
            data.pop("failure")
        data["default"] = self.source == "default"
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> "Decision":
        """The decision ``data`` holds; ValueError (the caller's clean miss) for one this version
        cannot serve: a field of the wrong type or out of range, whoever wrote it."""
        try:
            return cls._from_json(data, source)
        except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a decision this version can use: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _from_json(cls, data: dict[str, Any], source: str) -> "Decision":
        if data.get("default") or "error" in data:
            source = "default"
        ranking, excluded = data.get("ranking", []), data.get("excluded", [])
        if not isinstance(ranking, list) or not isinstance(excluded, list) or not all(
            isinstance(e, dict) for e in ranking + excluded
        ):
            raise ValueError("'ranking' and 'excluded' must be lists of objects")
        for e in ranking:
            _check_entry(e)
        return cls(
            key=data.get("key", {}),
            ranking=list(ranking),
            excluded=list(excluded),
            source=source,
            created=float(data.get("created", time.time())),
            tune_s=float(data.get("tune_s", 0.0)),
            measured=int(data.get("measured", 0)),
            offered=int(data.get("offered", 0)),
            provisional=data.get("provisional") is True,
            phases=_phases_of(data.get("phases")),
            spent={str(k): _phases_of(v) for k, v in data["spent"].items()}
            if isinstance(data.get("spent"), dict) else {},
            failure=data["failure"][:2000] if isinstance(data.get("failure"), str) else None,
        )

    @property
    def winner(self) -> dict[str, Any] | None:
        return self.ranking[0] if self.ranking else None


def _check_entry(e: dict[str, Any]) -> None:
    """A ranked entry this version can serve, else ValueError (the caller's clean miss): a PyTorch
    candidate by a name and index this version knows, a kernel by a non-negative impl index."""
    index = e.get("impl")
    if not isinstance(index, int) or isinstance(index, bool):  # JSON integers only (not 1e400, not "0")
        raise ValueError(f"ranking entry without an integer impl index: {e!r}"[:300])
    if e.get("backend") == TORCH:
        name = e.get("impl_name")
        if TORCH_INDEX.get(name) != index:  # type: ignore[arg-type]
            raise ValueError(f"unknown PyTorch candidate {name!r} (index {index}) in a ranking entry")
    elif index < 0:
        raise ValueError(f"ranking entry with impl index {index} for backend {e.get('backend')!r}")


def _phases_of(value: Any) -> dict[str, float]:
    """A stored decision's seconds by phase; an unreadable field is no phases (it only informs)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")}


def entry_label(e: dict[str, Any]) -> str:
    """A decision entry as its candidate's ``label`` reads ('triton:launch[BLOCK=256]', 'torch:eager')."""
    if e.get("backend") == TORCH:
        return f"torch:{e.get('impl_name')}"
    return f"{e.get('backend')}:{e.get('impl_name')}[{Config.of(e.get('config') or {}, where='entry').label()}]"
