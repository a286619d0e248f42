"""Inductor custom graph passes that keep the pass configured before them.

``torch._inductor.config.post_grad_custom_pre_pass`` and ``..._post_pass`` hold one pass each;
kernelgraft's passes (pattern grafts, the in-graph choice) wrap whatever was there and run it
first, and their ``uuid`` (Inductor's FX graph cache key) covers it, or is None, uncacheable, when
that pass has no uuid of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

__all__ = ["chained_pass_class", "Slot"]


def chained_pass_class(name: str, run: Callable[[fx.Graph], None], identity: Callable[[], Any]) -> type:
    """A ``CustomGraphPass`` class whose instances wrap a previous pass: ``run(graph)`` after it,
    ``uuid()`` = (``name``, the previous pass's uuid, ``identity()``)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class ChainedPass(CustomGraphPass):
        def __init__(self, previous: Any = None) -> None:
            self.previous = previous

        def __call__(self, graph: fx.Graph) -> None:
            if self.previous is not None:
                self.previous(graph)
            run(graph)

        def uuid(self) -> Any:
            prev = None
            if self.previous is not None:
                prev = self.previous.uuid() if hasattr(self.previous, "uuid") else None
                if prev is None:
                    return None  # an uncacheable pass was configured before us
            return (name, prev, identity())

    ChainedPass.__name__ = ChainedPass.__qualname__ = f"{name.title().replace('-', '')}Pass"
    return ChainedPass


class Slot:
    """One of Inductor's custom pass settings (``attr``, e.g. "post_grad_custom_post_pass") holding
    a kernelgraft pass that wraps what was there; the pass class is made on first use (importing
    Inductor only then). Callers hold their own lock."""

    def __init__(self, attr: str, name: str, run: Callable[[fx.Graph], None], identity: Callable[[], Any]) -> None:
        self.attr, self.name, self.run, self.identity = attr, name, run, identity
        self.cls: type | None = None

    def install(self) -> None:
        import torch._inductor.config as config

        if self.cls is None:
            self.cls = chained_pass_class(self.name, self.run, self.identity)
        current = getattr(config, self.attr)
        if not isinstance(current, self.cls):
            setattr(config, self.attr, self.cls(current))

    def uninstall(self) -> None:
        """Put back the pass ours wrapped, if ours is still the one set."""
        import torch._inductor.config as config

        current = getattr(config, self.attr)
        if self.cls is not None and isinstance(current, self.cls):
            setattr(config, self.attr, current.previous)

    def installed(self) -> bool:
        import torch._inductor.config as config

        return self.cls is not None and isinstance(getattr(config, self.attr), self.cls)
