"""A zygote: one process that does a compile worker's heavy imports once and forks the workers.

Started workers each import torch and Triton (seconds of CPU each, and a pool of 15 importing at
once shares the cores: most of a cold pool's wall time). The zygote is
``python -m kernelgraft.tune.compile_zygote_serve`` (its side of things is there), started like a
worker (same environment, plus ``OMP_NUM_THREADS=1``: torch's import would otherwise start its
OpenMP pool, a thread, and workers only compile); it imports what a worker imports, never touches
CUDA, and refuses to serve (the pool then starts workers of their own) when the import left a
second thread: a fork copies only the forking thread, and whatever lock another thread held stays
held in the child for ever.

Where the pool names op modules (``PRELOAD``: the modules of the ops ``kg.tune.warm()`` found
registered, or of the op whose tuning started the pool), the zygote imports them too, after that
check, in a child it forks for the trial, so every worker forked from that child has them (an
example module importing CuTe DSL and cuTile takes about a second, which each worker would
otherwise pay at its first job). A module that fails to import is left to the workers (whose job
then reports why). One whose import starts a thread or initialises CUDA ends the trial: the zygote
says which module it left out (``left_out``; the pool does not name it again) and a new trial
child imports the others; after a few trials it serves without the named modules, having imported
torch and Triton once all the same.

It serves requests on a Unix socket (its stdin), one at a time, 9-byte messages ``<kind><int64>``.
First, from the zygote: ``M`` (a module left out; the value is the length of the JSON
``{"module": index in PRELOAD or -1, "why": text}`` that follows), ``I`` with the pid of the process
that serves (the zygote or its trial child: the workers' parent), then ``R`` (ready, the value the
time in microseconds), or ``E`` (refused: the length of the reason that follows). Then, from the pool:
  ``F`` with two file descriptors (the worker's request pipe, read end; its answer pipe, write
  end): it forks; the child runs ``compile_worker.serve`` on those pipes; the zygote answers ``P``
  with the child's pid and a pidfd of it (opened before the child can be reaped, so it names that
  very process however soon it exits), or ``E`` with an errno;
  ``W`` with a pid: the exit code of that child, once it exited (``C``), or ``U`` when unknown.
The serving process reaps its children as they exit and keeps their codes for ``W``. It exits at
EOF on its socket: when the pool closes it or the pool's process dies; the process the pool started
exits with it (a trial child dies with that one). A worker exits at EOF on its request pipe, whose
write end only the pool holds: no process outlives the pool's process.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import BinaryIO

__all__ = ["ENV", "PRELOAD", "MSG", "Forked", "Zygote", "available", "message", "read_message"]

log = logging.getLogger(__name__)
ENV = "KERNELGRAFT_COMPILE_ZYGOTE"  # 0 / off: every worker is started on its own
PRELOAD = "KERNELGRAFT_COMPILE_PRELOAD"  # JSON [[module, path or null], ...]: op modules imported before forking
MSG = struct.Struct("<cq")
_TEXT_MAX = 4096  # the longest text after an E or M
_ANSWER_S = 30.0  # a fork or a status takes milliseconds; a zygote silent for longer is broken


def available() -> bool:
    """Whether this process can use a zygote: Linux's fork and pidfds (Python >= 3.9), not turned off."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    return all(hasattr(m, n) for m, n in ((os, "fork"), (os, "pidfd_open"), (signal, "pidfd_send_signal"),
                                          (socket, "send_fds"), (socket, "recv_fds")))


def read_message(sock: socket.socket) -> tuple[bytes, int, list[int]]:
    """One message and the descriptors that came with it; EOFError when the other side closed."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MSG.size, 2)
    while data and len(data) < MSG.size:
        more = sock.recv(MSG.size - len(data))
        if not more:
            break
        data += more
    if len(data) < MSG.size:
        for fd in fds:
            os.close(fd)
        raise EOFError
    kind, value = MSG.unpack(data)
    return kind, value, fds


def message(kind: bytes, text: str) -> bytes:
    """A message whose value is the length of the text that follows it (``E``, ``M``)."""
    data = text.encode()[:_TEXT_MAX]
    return MSG.pack(kind, len(data)) + data


def _text(sock: socket.socket, length: int) -> str:
    data, length = b"", max(0, min(length, _TEXT_MAX))
    while len(data) < length:
        more = sock.recv(length - len(data))
        if not more:
            raise EOFError
        data += more
    return data.decode(errors="replace")


# -- the pool's side ------------------------------------------------------------------------------

class Forked:
    """A worker forked by the zygote, seen from the pool: not the pool's child, so it is watched
    through its pidfd (no pid reuse can fool it) and its exit code comes from the zygote."""

    def __init__(self, pid: int, pidfd: int, zygote: Zygote) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self._zygote = zygote
        self._code: int | str | None = None

    def _exited(self) -> int | str:
        code = self._zygote.exit_code(self.pid)
        self._code = code if code is not None else "exit status unknown"
        self.release()
        return self._code

    def poll(self) -> int | str | None:
        """None while it runs, else its exit code."""
        if self._code is None and select.select([self._pidfd], [], [], 0)[0]:
            return self._exited()
        return self._code

    def wait(self, timeout: float) -> int | str:
        if self._code is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise TimeoutError(f"worker {self.pid} still runs after {timeout:.0f} s")
            return self._exited()
        return self._code

    def kill(self) -> None:
        if self._code is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def release(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Zygote:
    """The pool's zygote: started at once (it imports in the background); ``fork()`` waits for it."""

    def __init__(self, env: dict[str, str], startup_s: float, preload: tuple = ()) -> None:
        self._started = time.time()  # wall clock: compared with the zygote's when it is ready
        env = dict(env)
        env["OMP_NUM_THREADS"] = "1"  # no OpenMP pool: the zygote must stay one thread
        self.preload = tuple(preload)  # the op modules (compile_jobs.Source) it imports before forking
        env.pop(PRELOAD, None)
        if self.preload:
            env[PRELOAD] = json.dumps([[s.module, s.path] for s in self.preload])
        self.refusal: str | None = None  # why it refused to fork, when it did
        self.left_out: dict = {}  # named module whose import made forking unsafe (Source) -> why
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", f"{__package__}.compile_zygote_serve"],
                                          stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._startup_s = startup_s
        self._lock = threading.Lock()
        self._state = "starting"  # then "ready", or "broken" for good
        self._server: int | None = None  # the pid of the process that forks (said before "ready")
        self.imports_s: float | None = None  # from its start until it was ready to fork (its imports)

    @property
    def pid(self) -> int:
        """The pid of the process that forks the workers, once it said so; until then the pid of
        the process the pool started (the same, unless a trial child imported the named modules)."""
        return self._server if self._server is not None else self._proc.pid

    @property
    def preloaded(self) -> bool:
        """Whether the workers it forks have the op modules it was named, but those in ``left_out``
        (a trial child imported them, and forks them); False where it serves without them, or is
        not ready yet."""
        return self._state == "ready" and self._server is not None and self._server != self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None  # it exits with the child that serves, which dies with it

    @property
    def serving(self) -> bool:
        """Whether it forks workers (or may still: it is importing)."""
        return self._state != "broken" and self.alive

    def _broken(self, why: str) -> None:
        if self._state != "broken":
            log.warning("compile workers start on their own: the zygote %s", why)
        self._state = "broken"
        self._sock.close()
        if self._proc.poll() is None:
            self._proc.kill()  # a trial child, serving or not, dies with it
        self._proc.wait()

    def _ask(self, kind: bytes, value: int, fds: list[int], timeout: float) -> tuple[bytes, int, list[int]]:
        self._sock.settimeout(timeout)
        if fds:
            socket.send_fds(self._sock, [MSG.pack(kind, value)], fds)
        else:
            self._sock.sendall(MSG.pack(kind, value))
        return read_message(self._sock)

    def _leave_out(self, text: str) -> None:
        try:
            said = json.loads(text)
            index, why = int(said["module"]), str(said["why"])
        except (ValueError, TypeError, KeyError) as exc:
            raise EOFError(f"a garbled M: {text[:200]!r}") from exc
        module = self.preload[index] if 0 <= index < len(self.preload) else None
        if module is not None:
            self.left_out[module] = why
        log.info("the compile zygote leaves %s to its workers, each importing it at its first job: %s",
                 module.module if module is not None else "the op modules it was named", why)

    def _ready(self) -> bool:
        deadline = time.monotonic() + self._startup_s
        try:
            while self._state == "starting":
                self._sock.settimeout(max(0.001, deadline - time.monotonic()))
                kind, value, fds = read_message(self._sock)
                for fd in fds:
                    os.close(fd)
                if kind == b"R":
                    self._state = "ready"
                    self.imports_s = max(0.0, value / 1e6 - self._started)
                elif kind == b"I":
                    self._server = value
                elif kind == b"M":
                    self._leave_out(_text(self._sock, value))
                elif kind == b"E":
                    self.refusal = _text(self._sock, value)
                    self._broken("refused: " + self.refusal)
                else:
                    self._broken(f"said {kind!r}")
        except (OSError, EOFError) as exc:  # a timeout too
            self._broken(f"did not start: {type(exc).__name__}: {exc}")
        return self._state == "ready"

    def wait_ready(self) -> bool:
        """Wait for its imports (at most the start-up bound): whether it can fork."""
        with self._lock:
            return self._ready()

    def fork(self) -> tuple[Forked, BinaryIO, BinaryIO] | None:
        """A new worker: its process, the pipe its jobs go in, the pipe its answers come out of; None
        where the zygote cannot (the pool starts a worker of its own)."""
        with self._lock:
            if not self._ready():
                return None
            requests_r, requests_w = os.pipe()
            answers_r, answers_w = os.pipe()
            try:
                kind, value, fds = self._ask(b"F", 0, [requests_r, answers_w], _ANSWER_S)
            except (OSError, EOFError) as exc:
                for fd in (requests_w, answers_r):
                    os.close(fd)
                self._broken(f"stopped answering: {type(exc).__name__}: {exc}")
                return None
            finally:  # the child's ends: the zygote and its child hold them now
                os.close(requests_r)
                os.close(answers_w)
            if kind != b"P" or len(fds) != 1:
                for fd in [*fds, requests_w, answers_r]:
                    os.close(fd)
                if kind == b"E":  # this fork failed (out of processes, of memory): the zygote goes on
                    log.info("the compile zygote could not fork: %s", os.strerror(value))
                else:
                    self._broken(f"answered a fork with {kind!r}")
                return None
            return Forked(value, fds[0], self), os.fdopen(requests_w, "wb", buffering=0), os.fdopen(
                answers_r, "rb", buffering=0)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a worker it forked that exited; None when unknown."""
        with self._lock:
            if self._state != "ready":
                return None
            try:
                kind, value, fds = self._ask(b"W", pid, [], _ANSWER_S)
            except (OSError, EOFError) as exc:
                self._broken(f"stopped answering: {type(exc).__name__}: {exc}")
                return None
            for fd in fds:
                os.close(fd)
            return value if kind == b"C" else None

    def close(self) -> None:
        """EOF on its socket ends it (the workers it forked end at EOF on their own pipes)."""
        with self._lock:
            self._state = "broken"
            self._sock.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
