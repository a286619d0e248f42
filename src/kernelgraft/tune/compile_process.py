"""One compile worker process, seen from the pool: started on its own, or forked by the pool's zygote.

Either way the pool talks to it the same way (length-prefixed pickles on two pipes: jobs in,
outcomes out, ``compile_worker``) and watches it through one small interface, ``poll``, ``wait``,
``kill`` and ``release``: a ``Popen`` for a worker started on its own; a pidfd for a forked one,
which is the zygote's child, not the pool's (``compile_zygote.Forked``).
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
from typing import Any

from .compile_jobs import Job, Outcome
from .compile_worker import HEADER, send
from .compile_zygote import Forked, Zygote

__all__ = ["Worker", "STARTUP_S", "JOB_TIMEOUT_S"]

STARTUP_S = 120.0  # a worker that has not imported torch and triton by then is not coming
JOB_TIMEOUT_S = 600.0  # one compile; a worker silent for longer is killed (the gate compiles it)


class _Started:
    """A worker started on its own (``python -m kernelgraft.tune.compile_worker``), as ``Forked`` is one
    forked by the zygote: poll, wait, kill, release."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernelgraft.tune.compile_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(str(exc)) from None

    def kill(self) -> None:
        self.proc.kill()

    def release(self) -> None:
        pass


class Worker:
    """One worker process: forked by the pool's zygote at its first job where there is one (the
    imports are done: it answers at once), else started on its own at once (it imports meanwhile)."""

    def __init__(self, env: dict[str, str], zygote: Zygote | None) -> None:
        self._env = env
        self._zygote = zygote
        self.proc: _Started | Forked | None = None
        self.ready = False
        if zygote is None:
            self._start()

    def _start(self) -> None:
        started = _Started(self._env)
        self.proc, self._stdin, self._stdout = started, started.proc.stdin, started.proc.stdout

    def _launch(self) -> None:
        if self.proc is None:
            forked = self._zygote.fork() if self._zygote is not None else None
            if forked is None:  # no zygote, or it cannot fork: a worker of its own
                self._start()
            else:
                self.proc, self._stdin, self._stdout = forked

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _receive(self, timeout_s: float) -> Any:
        """The next answer, read unbuffered within ``timeout_s`` (a silent worker is killed)."""
        fd = self._stdout.fileno()
        deadline = time.monotonic() + timeout_s

        def exactly(n: int) -> bytes:
            out = b""
            while len(out) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self.proc.kill()
                    raise TimeoutError(f"no answer in {timeout_s:.0f} s")
                chunk = os.read(fd, n - len(out))
                if not chunk:
                    raise EOFError
                out += chunk
            return out

        (size,) = HEADER.unpack(exactly(HEADER.size))
        return pickle.loads(exactly(size))

    def call(self, job: Job) -> Outcome:
        self._launch()
        try:
            if not self.ready:
                if self._receive(STARTUP_S) != "ready":
                    raise EOFError
                self.ready = True
            send(self._stdin, job)
            return self._receive(JOB_TIMEOUT_S)
        except TimeoutError as exc:
            return Outcome(False, 0.0, f"the compile worker was stopped: {exc}")
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            try:
                code: Any = self.proc.wait(timeout=5)
            except TimeoutError:
                code = f"{type(exc).__name__}: {exc}"
            return Outcome(False, 0.0, f"the compile worker exited ({code})")

    @property
    def alive(self) -> bool:
        """Running, or not started yet (a fork at its first job)."""
        return self.proc is None or self.proc.poll() is None

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self._stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except TimeoutError:
            self.proc.kill()
            self.proc.wait(timeout=60)
        self.proc.release()
        try:
            self._stdout.close()
        except OSError:
            pass
