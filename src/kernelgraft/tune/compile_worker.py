"""A compile worker: ``python -m kernelgraft.tune.compile_worker``, started by ``_compile_pool``.

Reads length-prefixed pickled ``Job`` objects on stdin and answers each with a pickled ``Outcome``
on stdout, until stdin closes. The first message out is ``"ready"``, sent once the heavy imports
are done, so a pool knows its workers started. Anything the imported user code prints goes to
stderr: the real stdout is kept for answers only. A worker forked from a zygote (``compile_zygote``)
has those imports already and runs ``serve`` on pipes of its own.

A worker lowers its own CPU priority first (``WORKER_NICE``, in ``imports``: a zygote's forks and
its compilers' subprocesses inherit it), before the imports: a pool of one worker per core but one,
importing torch and then compiling, must not take cores from the threads serving in the process
that started it. Only the scheduling changes: what a worker compiles is the same.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct("<Q")  # the length of each pickled message that follows
WORKER_NICE = 10  # added to the worker's niceness: serving's threads come first on a busy host


def lower_priority() -> None:
    """Make this process yield the CPU to normal-priority work (nothing where there is no
    ``os.nice``, or it is refused: the worker then compiles at the parent's priority)."""
    nice = getattr(os, "nice", None)
    if nice is None:
        return
    try:
        nice(WORKER_NICE)
    except OSError:
        pass


def send(stream: BinaryIO, value: Any) -> None:
    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(blob)) + blob)
    while view:  # an unbuffered pipe may take part of a large write
        written = stream.write(view)
        view = view[written if written is not None else len(view):]
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    """The next message; EOFError when the other side closed the pipe."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        raise EOFError
    (size,) = HEADER.unpack(head)
    blob = stream.read(size)
    if len(blob) < size:
        raise EOFError
    return pickle.loads(blob)


def imports() -> None:
    """The heavy imports a worker does before it says "ready" (a zygote does them once for all),
    at the lower priority."""
    lower_priority()
    import torch  # noqa: F401

    from . import compile_jobs  # noqa: F401

    try:
        import triton  # noqa: F401
    except ImportError:
        pass


def serve(requests: BinaryIO, answers: BinaryIO) -> int:
    """Say "ready", then answer each job until ``requests`` closes (a forked worker runs this too)."""
    from . import compile_jobs as _compile_jobs

    send(answers, "ready")
    while True:
        try:
            job = receive(requests)
        except EOFError:
            return 0
        send(answers, _compile_jobs.run_job(job))


def main() -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints from imported modules must not corrupt the answers
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    imports()
    return serve(requests, answers)


if __name__ == "__main__":
    sys.exit(main())
