"""Tune ahead on several ranks (``torchrun``, one host or several): split the keys, merge the decisions.

Tuning ahead is collective: every rank calls ``pretune`` with the same calls. Then:

1. Every rank plans the same keys, or all of them stop with the same error: a key's digest holds
   the device, driver and toolchain, so ranks on different GPUs or versions would tune keys that
   are not each other's (see ``_key``).
2. Decisions any rank already holds (in memory or its tune.json) are shared and not tuned again:
   a re-run resumes where the last one stopped, on whichever host each decision was made.
3. The other keys are split by ``share``: longest first (a key's candidate count stands for its
   cost), each to the least loaded rank, ties to the lower rank; the same split on every rank.
   Candidates of one key are not split: their timings are only comparable on one GPU, in one
   sitting (the finalists are timed together); their compiles run in parallel (``_compile_pool``).
4. Each rank tunes its share; each decision is in its own tune.json as soon as it is made (as any
   tuning's), so what a rank finished survives whatever happens next. A rank that raises stops
   there: its unfinished keys are 'lost' (a re-run tunes them), and it re-raises after step 5.
5. Every rank publishes its decisions through the process group's store (no shared filesystem is
   assumed) and merges everyone's into its memory and tune.json. A key decided on more than one
   rank keeps the lowest rank's entry, so every file ends the same. Each key was decided by one
   rank, with the tuner's own tie rule (tie margin, then declaration order).

A rank that dies without raising (killed, a crashed driver) never publishes: under ``torchrun``
the job then ends; the decisions every rank finished are in its tune.json, and a re-run merges
them first (step 2).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from . import dist as _dist
from .pretune import KeyJob, KeyResult, known_entry, run_keys
from .decision import Decision
from .tuner import TUNER

__all__ = ["share", "pretune_ranks"]

log = logging.getLogger(__name__)
# The last exchange waits for every rank to finish its share: hours for a large suite. A rank that
# fails raises and still exchanges; one that dies ends the torchrun job.
FINISH_TIMEOUT_S = 7 * 24 * 3600.0
_calls = itertools.count()


def share(costs: Sequence[int], world: int) -> list[list[int]]:
    """Job indices per rank, each in plan order: longest first to the least loaded rank.

    >>> share([36, 10, 10, 36, 4], 2)
    [[0, 1, 4], [2, 3]]
    """
    loads = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        loads[r] += max(1, costs[i])
        owned[r].append(i)
    return [sorted(o) for o in owned]


def _merge(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for entries in per_rank:  # rank order: the lowest rank's entry of a key stays
        for digest, entry in entries.items():
            merged.setdefault(digest, entry)
    return merged


def pretune_ranks(jobs: Sequence[KeyJob], *, force: bool, progress: bool,
                  on_key: Callable[[KeyResult], None] | None = None) -> tuple[list[KeyResult], BaseException | None]:
    """Tune ``jobs`` across the ranks of the default process group (see the module docstring);
    (this rank's view of every key, the exception this rank raised, if any)."""
    rank, world = _dist.rank(), _dist.world()
    digests = [j.digest for j in jobs]
    plan = hashlib.sha256("\n".join(digests).encode()).hexdigest()[:16]
    tag = f"pretune/{plan}/{next(_calls)}"
    plans = _dist.gather(f"{tag}/plan", plan)
    if len(set(plans)) != 1:
        raise RuntimeError(
            f"kernelgraft pretune: ranks planned different keys (plans {plans}); every rank must call "
            "pretune with the same calls, on the same GPU model, driver and toolchain versions")
    held = {} if force else {j.digest: e for j in jobs if j.key is not None and (e := known_entry(j.key))}
    known = _merge(_dist.gather(f"{tag}/held", held))
    todo = [i for i, j in enumerate(jobs) if j.digest not in known]
    mine = [todo[i] for i in share([jobs[i].cost for i in todo], world)[rank]]
    log.info("pretune rank %d of %d: %d keys held, %d to tune, %d of them here", rank, world, len(known),
             len(todo), len(mine))
    done: list[KeyResult] = []

    def keep(result: KeyResult) -> None:
        done.append(result)
        if on_key is not None:
            on_key(result)

    error: BaseException | None = None
    try:
        run_keys([jobs[i] for i in mine], force=force, progress=progress, rank=rank, on_key=keep)
    except BaseException as exc:  # published below first; re-raised by the caller
        error = exc
        log.warning("pretune rank %d stopped after %d of its %d keys: %s: %s", rank, len(done), len(mine),
                    type(exc).__name__, exc)
    made = {}
    for r in done:
        if r.status == "tuned":
            d = TUNER.memory.get(r.digest)
            if d is not None and not d.provisional:
                made[r.digest] = d.to_json()
    gathered = _dist.gather(f"{tag}/made", {"entries": made, "results": [vars(r) for r in done]},
                            timeout_s=FINISH_TIMEOUT_S)
    new = _merge([g["entries"] for g in gathered])
    merged = {**new, **known}  # a key held before the run keeps the held entry
    if merged:
        TUNER.disk.put(merged)
        for digest, entry in merged.items():
            try:
                decision = Decision.from_json(entry, "rank")
            except ValueError:
                continue
            if decision.source != "default":
                TUNER.memory[digest] = decision
    results: dict[str, KeyResult] = {}
    for g in gathered:
        for r in g["results"]:
            results.setdefault(r["digest"], KeyResult(**r))
    out = []
    for j in jobs:
        r = results.get(j.digest)
        if r is None:
            r = KeyResult(j.op.name, j.label, j.digest, "cached" if j.digest in known else "lost")
        out.append(r)
    return out, error
