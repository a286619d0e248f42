"""A zygote: one process that does a compile worker's heavy imports once and forks the workers.

Started workers each import torch and Triton (seconds of CPU each, and a pool of 15 importing at
once shares the cores: most of a cold pool's wall time). The zygote is
``python -m kernelgraft.tune.compile_zygote``, started like a worker (same environment, plus
``OMP_NUM_THREADS=1``: torch's import would otherwise start its OpenMP pool, a thread, and workers
only compile); it imports what a worker imports (``compile_worker.imports``), computes what each worker's first
Triton compile would (``warm_process``), never touches CUDA,
and refuses to serve (the pool then starts workers of their own) when the import left a second
thread: a fork copies only the forking thread, and whatever lock another thread held stays held
in the child for ever.

Where the pool names op modules (``PRELOAD``: the modules of the ops ``kg.tune.warm()`` found
registered, or of the op whose tuning started the pool), the zygote imports them too, after that
check, so every worker it forks has them (an example module importing CuTe DSL and cuTile takes
about a second, which each worker would otherwise pay at its first job). A module that fails to
import is left to the workers (whose job then reports why); one whose import starts a thread or
initialises CUDA makes the zygote refuse to fork, and the pool does not name it again.

It then serves requests on a Unix socket (its stdin), one at a time, 9-byte messages ``<kind><int64>``:
  ``F`` with two file descriptors (the worker's request pipe, read end; its answer pipe, write
  end): it forks; the child runs ``compile_worker.serve`` on those pipes; the zygote answers ``P``
  with the child's pid and a pidfd of it (opened before the child can be reaped, so it names that
  very process however soon it exits), or ``E`` with an errno;
  ``W`` with a pid: the exit code of that child, once it exited (``C``), or ``U`` when unknown.
The zygote reaps its children as they exit (SIGCHLD) and keeps their codes for ``W``. It exits at
EOF on its socket: when the pool closes it or the pool's process dies. A worker exits at EOF on its
request pipe, whose write end only the pool holds: no process outlives the pool's process.
"""

from __future__ import annotations

import errno
import gc
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

from . import compile_worker

__all__ = ["ENV", "PRELOAD", "Forked", "Zygote", "available"]

log = logging.getLogger(__name__)
ENV = "KERNELGRAFT_COMPILE_ZYGOTE"  # 0 / off: every worker is started on its own
PRELOAD = "KERNELGRAFT_COMPILE_PRELOAD"  # JSON [[module, path or null], ...]: op modules imported before forking
_IMPORTING = "importing {}"  # how a refusal after a preloaded module begins (Zygote.refused_after)
MSG = struct.Struct("<cq")
_ANSWER_S = 30.0  # a fork or a status takes milliseconds; a zygote silent for longer is broken
_KEPT_CODES = 4096


def available() -> bool:
    """Whether this process can use a zygote: Linux's fork and pidfds (Python >= 3.9), not turned off."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    return all(hasattr(m, n) for m, n in ((os, "fork"), (os, "pidfd_open"), (signal, "pidfd_send_signal"),
                                          (socket, "send_fds"), (socket, "recv_fds")))


def _read(sock: socket.socket) -> tuple[bytes, int, list[int]]:
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=theirs.fileno(),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._startup_s = startup_s
        self._lock = threading.Lock()
        self._state = "starting"  # then "ready", or "broken" for good
        self.imports_s: float | None = None  # from its start until it was ready to fork (its imports)

    def refused_after(self) -> object | None:
        """The preloaded op module (``compile_jobs.Source``) whose import made it refuse to fork;
        None where it did not refuse, or refused for another reason."""
        if self.refusal is None:
            return None
        return next((s for s in self.preload if self.refusal.startswith(_IMPORTING.format(s.module) + " ")), None)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def serving(self) -> bool:
        """Whether it forks workers (or may still: it is importing)."""
        return self._state != "broken" and self.alive

    def _broken(self, why: str) -> None:
        if self._state != "broken":
            # after an op module's import the pool starts a zygote without it (``CompilePool``)
            then = "" if self.refused_after() is not None else "compile workers start on their own: "
            log.warning("%sthe zygote %s", then, why)
        self._state = "broken"
        self._sock.close()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _ask(self, kind: bytes, value: int, fds: list[int], timeout: float) -> tuple[bytes, int, list[int]]:
        self._sock.settimeout(timeout)
        if fds:
            socket.send_fds(self._sock, [MSG.pack(kind, value)], fds)
        else:
            self._sock.sendall(MSG.pack(kind, value))
        return _read(self._sock)

    def _ready(self) -> bool:
        if self._state == "starting":
            try:
                self._sock.settimeout(self._startup_s)
                kind, value, fds = _read(self._sock)
                for fd in fds:
                    os.close(fd)
                if kind == b"R":
                    self._state = "ready"
                    self.imports_s = max(0.0, value / 1e6 - self._started)
                elif kind == b"E":
                    self.refusal = self._sock.recv(max(0, min(value, 4096))).decode(errors="replace")
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


# -- the zygote's side ----------------------------------------------------------------------------

_codes: dict[int, int] = {}  # exit codes of reaped children, until the pool asks


def _reap(_signum: int, _frame: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _codes[pid] = os.waitstatus_to_exitcode(status)
        while len(_codes) > _KEPT_CODES:  # codes nobody asks for (workers killed at close)
            _codes.pop(next(iter(_codes)))


def _threads() -> list[str]:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return [t.name for t in threading.enumerate()]
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            names.append(tid)
    return names


def _refusal() -> str | None:
    """Why this process must not fork workers; None when it may (the imports are done then)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:  # a kernel older than 5.3
        return f"pidfd_open: {exc}"
    compile_worker.imports()
    try:  # a cache every worker would otherwise compute at its first job
        from ..backends.triton.ahead import warm_process

        warm_process()
    except Exception as exc:  # Triton missing or other: its workers compute it themselves
        log.debug("Triton not warmed: %s", exc)
    return _unsafe("the imports") or _preload()


def _unsafe(after: str) -> str | None:
    """Why forking is unsafe now (``after`` says what ran: "the imports"), else None."""
    import torch

    if torch.cuda.is_initialized():
        return f"{after} initialised CUDA"
    threads = _threads()
    if len(threads) > 1:
        return f"{after} started threads ({', '.join(threads)}); a fork would copy the locks they hold"
    return None


def _preload() -> str | None:
    """Import the op modules the pool named (``PRELOAD``); why forking is unsafe after one of
    them, else None."""
    from . import compile_jobs

    try:
        named = [compile_jobs.Source(str(m), p if isinstance(p, str) else None)
                 for m, p in json.loads(os.environ.get(PRELOAD) or "[]")]
    except (ValueError, TypeError) as exc:  # nothing preloaded: the workers import at their first job
        log.warning("%s is not a list of [module, path]: %s", PRELOAD, exc)
        return None
    for source in named:
        try:
            compile_jobs.import_source(source)
        except Exception as exc:  # the workers import it at their first job, and say why it fails
            log.warning("op module %s not imported ahead: %s: %s", source.module, type(exc).__name__, exc)
            continue
        why = _unsafe(_IMPORTING.format(source.module))
        if why is not None:
            return why
    return None


def _child(sock: socket.socket, requests: int, answers: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the compilers it runs are its to wait for
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sock.close()
        code = compile_worker.serve(os.fdopen(requests, "rb"), os.fdopen(answers, "wb"))
    finally:
        os._exit(code)  # never the zygote's exit handlers, never back into its loop


def _fork(sock: socket.socket, fds: list[int]) -> None:
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        sock.sendall(MSG.pack(b"E", errno.EINVAL))
        return
    requests, answers = fds
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # unreaped until its pidfd is open
    try:
        try:
            pid = os.fork()
        except OSError as exc:
            sock.sendall(MSG.pack(b"E", exc.errno or errno.EAGAIN))
            return
        if pid == 0:
            _child(sock, requests, answers)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
            sock.sendall(MSG.pack(b"E", exc.errno or errno.EINVAL))
            return
        try:
            socket.send_fds(sock, [MSG.pack(b"P", pid)], [pidfd])
        finally:
            os.close(pidfd)
    finally:
        os.close(requests)
        os.close(answers)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def _exit_code(pid: int) -> bytes:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        code = _codes.pop(pid, None)
        if code is None:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got = status = 0
            if got:
                code = os.waitstatus_to_exitcode(status)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return MSG.pack(b"C", code) if code is not None else MSG.pack(b"U", 0)


def main() -> int:
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the children get pipes of their own, never this socket
    os.close(null)
    os.dup2(2, 1)  # prints from imported modules go to stderr, as in a worker
    sys.stdout = sys.stderr
    refusal = _refusal()  # the imports, then whether a fork is safe
    if refusal is not None:
        text = refusal.encode()[:4096]
        sock.sendall(MSG.pack(b"E", len(text)) + text)
        return 1
    signal.signal(signal.SIGCHLD, _reap)
    gc.freeze()  # the imported objects stay out of the children's collections: their pages stay shared
    sock.sendall(MSG.pack(b"R", int(time.time() * 1e6)))  # when it was ready (the parent knows when it started)
    while True:
        try:
            kind, value, fds = _read(sock)
            if kind == b"F":
                _fork(sock, fds)
                continue
            for fd in fds:
                os.close(fd)
            if kind != b"W":
                return 2
            sock.sendall(_exit_code(value))
        except (EOFError, OSError):  # the pool closed the socket, or its process is gone
            return 0


if __name__ == "__main__":
    sys.exit(main())
