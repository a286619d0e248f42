"""The native replay: eager calls of a one-launch plan replayed by a small C++ extension.

The extension is compiled once per torch, Python and kernelgraft version into the cache directory.
Build it ahead of time (a server's image, a benchmark's setup) so that nothing compiles while a
process runs; otherwise the first op that wants it starts the build in a child process and eager
calls take the Python path until it is ready.

>>> import kernelgraft as kg
>>> kg.native.build()  # doctest: +SKIP
PosixPath('/home/me/.cache/kernelgraft/native/torch2.11.0-py311-.../kernelgraft_native-....so')
"""

from __future__ import annotations

from ._native import build, busy, enabled, reason

__all__ = ["build", "busy", "enabled", "reason"]
