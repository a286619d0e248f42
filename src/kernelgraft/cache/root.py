"""The one directory every kernelgraft disk cache lives under.

``KERNELGRAFT_CACHE_DIR`` names it; ``off``, ``0`` or ``none`` turn disk caching off everywhere
(compiled code, tuning decisions: they then live in memory for the process only). Unset, it is
``$XDG_CACHE_HOME/kernelgraft`` when ``XDG_CACHE_HOME`` is an absolute path (the XDG base
directory rules ignore a relative one), else ``~/.cache/kernelgraft``. Each cache takes a
subdirectory or file of its own under it (``nvrtc/``, ``native/``, ``tune.json``) and reads the
root on every use, so changing the variable in a running process moves every cache together.

>>> import os
>>> saved = os.environ.get("KERNELGRAFT_CACHE_DIR")
>>> os.environ["KERNELGRAFT_CACHE_DIR"] = "/tmp/kg-doc"
>>> str(root()), str(root() / "tune.json")
('/tmp/kg-doc', '/tmp/kg-doc/tune.json')
>>> os.environ["KERNELGRAFT_CACHE_DIR"] = "off"
>>> root() is None
True
>>> _ = os.environ.pop("KERNELGRAFT_CACHE_DIR") if saved is None else os.environ.update(
...     KERNELGRAFT_CACHE_DIR=saved)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["root", "ENV", "OFF"]

ENV = "KERNELGRAFT_CACHE_DIR"
OFF = ("off", "0", "none")


def root() -> Path | None:
    """The cache root, or None when disk caching is off (``KERNELGRAFT_CACHE_DIR=off``)."""
    value = os.environ.get(ENV, "").strip()
    if value:
        if value.lower() in OFF:
            return None
        return Path(value).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kernelgraft"
