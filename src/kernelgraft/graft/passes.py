"""kernelgraft's Inductor custom graph passes, beside the user's.

``torch._inductor.config.post_grad_custom_pre_pass`` and ``..._post_pass`` take a pass, or (torch
2.6 and later) a list of passes, each run in turn, inference-aware ones with ``is_inference``, each
with its own ``uuid`` in the FX graph cache key. kernelgraft adds its pass to that list and takes
only its own out again, so a pass the user set keeps running exactly as Inductor runs it. Where the
setting takes one pass only, kernelgraft's wraps the one that was there and runs it first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

__all__ = ["Slot"]


class Slot:
    """One of Inductor's custom pass settings (``attr``, e.g. "post_grad_custom_post_pass") with a
    kernelgraft pass in it: ``run(graph)``, cache identity (``name``, None, ``identity()``). The
    pass class is made on first use (importing Inductor only then). Callers hold their own lock."""

    def __init__(self, attr: str, name: str, run: Callable[[fx.Graph], None], identity: Callable[[], Any]) -> None:
        self.attr, self.name, self.run, self.identity = attr, name, run, identity
        self.cls: type | None = None

    def _make(self) -> type:
        from torch._inductor.custom_graph_pass import CustomGraphPass

        slot = self

        class KernelgraftPass(CustomGraphPass):
            def __init__(self, previous: Any = None) -> None:
                self.previous = previous  # only where the setting holds one pass (old torch)

            def __call__(self, graph: fx.Graph) -> None:
                if self.previous is not None:
                    self.previous(graph)
                slot.run(graph)

            def uuid(self) -> Any:
                prev = None
                if self.previous is not None:
                    prev = self.previous.uuid() if hasattr(self.previous, "uuid") else None
                    if prev is None:
                        return None  # an uncacheable pass was configured before us
                return (slot.name, prev, slot.identity())

        return KernelgraftPass

    def _passes(self, current: Any) -> tuple | None:
        """The passes the setting holds, or None where it holds one pass only (old torch)."""
        try:
            from torch._inductor.custom_graph_pass import get_custom_graph_passes
        except ImportError:
            return None
        return get_custom_graph_passes(current)

    def _ours(self, p: Any) -> bool:
        return self.cls is not None and isinstance(p, self.cls)

    def install(self) -> None:
        import torch._inductor.config as config

        if self.cls is None:
            self.cls = self._make()
        current = getattr(config, self.attr)
        passes = self._passes(current)
        if passes is None:  # one pass only: wrap it
            if not self._ours(current):
                setattr(config, self.attr, self.cls(current))
        elif not any(self._ours(p) for p in passes):
            setattr(config, self.attr, [*passes, self.cls()] if passes else self.cls())

    def uninstall(self) -> None:
        """Take kernelgraft's pass out, leaving the others as they are."""
        import torch._inductor.config as config

        current = getattr(config, self.attr)
        passes = self._passes(current)
        if passes is None:
            if self._ours(current):
                setattr(config, self.attr, current.previous)
            return
        if any(self._ours(p) for p in passes):
            rest = [p for p in passes if not self._ours(p)]
            setattr(config, self.attr, None if not rest else rest)

    def installed(self) -> bool:
        import torch._inductor.config as config

        current = getattr(config, self.attr)
        passes = self._passes(current)
        return self._ours(current) if passes is None else any(self._ours(p) for p in passes)
