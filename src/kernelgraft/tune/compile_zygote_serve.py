"""The compile zygote's own side: ``python -m kernelgraft.tune.compile_zygote_serve``, started by
the pool's ``compile_zygote.Zygote`` (which says what the zygote is for and the messages it speaks).

It imports what a worker imports (``compile_worker.imports``), computes what each worker's first
Triton compile would (``warm_process``), never touches CUDA, and refuses (``E``) when that left a
second thread or initialised CUDA: a fork copies only the forking thread, and whatever lock another
thread held stays held in the child for ever.

Named op modules (``compile_zygote.PRELOAD``), it imports them in a trial: a forked child imports
them one after the other, checking after each that a fork is still safe. Where each is, that child
serves (its forks have every module) and this process only waits for it and exits with it; where
one is not (on a GPU machine, importing CuTe DSL or cuTile starts a CUDA driver thread), the child
says which over a pipe and exits, this process tells the pool which one it left out (``M``), and a
new trial imports the others (``_TRIALS`` at most; then this process serves without the named
modules): a refusal costs a child's imports, not a second import of torch and Triton. The trial child, and so the serving child, dies with this process
(``PR_SET_PDEATHSIG``): the pool watches, kills and waits for this one only.

The serving process says its pid (``I``), then that it is ready (``R``), and answers ``F`` and
``W`` one at a time until EOF on its socket; it reaps the workers it forked as they exit (SIGCHLD)
and keeps their codes for ``W``.
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
import sys
import threading
import time

from . import compile_worker
from .compile_zygote import MSG, PRELOAD, message, read_message

__all__ = ["main"]

log = logging.getLogger(__name__)
_KEPT_CODES = 4096
_TRIALS = 3  # trial children at most: each after the last one left a module out
_PR_SET_PDEATHSIG = 1
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


def _unsafe(after: str) -> str | None:
    """Why forking is unsafe now (``after`` says what ran: "the imports"), else None."""
    import torch

    if torch.cuda.is_initialized():
        return f"{after} initialised CUDA"
    threads = _threads()
    if len(threads) > 1:
        return f"{after} started threads ({', '.join(threads)}); a fork would copy the locks they hold"
    return None


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
    return _unsafe("the imports")


def _named() -> list:
    """The op modules the pool named (``compile_jobs.Source``), in its order."""
    from . import compile_jobs

    try:
        return [compile_jobs.Source(str(m), p if isinstance(p, str) else None)
                for m, p in json.loads(os.environ.get(PRELOAD) or "[]")]
    except (ValueError, TypeError) as exc:  # nothing preloaded: the workers import at their first job
        log.warning("%s is not a list of [module, path]: %s", PRELOAD, exc)
        return []


# -- the trial: a child imports the named modules ---------------------------------------------------

def _tell(fd: int, **what: object) -> None:
    os.write(fd, json.dumps(what).encode() + b"\n")  # one short line: a single write on a pipe


def _preload(named: list, report: int) -> bool:
    """Import ``named`` here, saying on ``report`` which one is next; whether forking is still safe
    after all of them (else the line says which module made it unsafe, and why)."""
    from . import compile_jobs

    for i, source in enumerate(named):
        _tell(report, trying=i)
        try:
            compile_jobs.import_source(source)
        except Exception as exc:  # the workers import it at their first job, and say why it fails
            log.warning("op module %s not imported ahead: %s: %s", source.module, type(exc).__name__, exc)
            continue
        why = _unsafe(f"importing {source.module}")
        if why is not None:
            _tell(report, unsafe=i, why=why)
            return False
    _tell(report, ok=True)
    return True


def _die_with(parent: int) -> None:
    """End this process when ``parent`` ends (SIGKILL from the kernel), as when it is gone already."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError) as exc:  # not Linux: the pool's EOF still ends it
        log.debug("no parent-death signal: %s", exc)
    if os.getppid() != parent:
        os._exit(1)


def _trial_child(sock: socket.socket, named: list, report_r: int, report_w: int, parent: int) -> None:
    code = 1
    try:
        os.close(report_r)
        _die_with(parent)
        safe = _preload(named, report_w)
        os.close(report_w)
        code = _serve(sock) if safe else 0
    finally:
        os._exit(code)  # never the base's exit handlers, never back into its frames


def _outcome(report: int, sock: socket.socket) -> dict | None:
    """What the trial child reported last: its verdict (``ok`` or ``unsafe``), else the module it was
    importing when it ended; None where the pool closed the socket meanwhile (nothing to serve)."""
    got: dict = {}
    buffer, watch = b"", [report, sock]
    while True:
        readable = select.select(watch, [], [])[0]
        if report in readable:
            chunk = os.read(report, 4096)
            if not chunk:
                return got  # the child ended without a verdict (a crash in an import)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                got = json.loads(line)
                if "ok" in got or "unsafe" in got:
                    return got
        elif sock in readable:
            try:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    return None
            except OSError:
                return None
            watch = [report]  # a request already (the child serves): its verdict is on the pipe


def _trials(sock: socket.socket, named: list) -> int | None:
    """Trials until one child serves (its exit code, this process's) or none may: each new trial
    leaves out the module the last one found unsafe (or ended in); None where this process serves,
    without the named modules."""
    indices = list(range(len(named)))  # the pool's indices of the modules still tried
    for _ in range(_TRIALS):
        if not indices:
            return None
        served, failed = _trial(sock, [named[i] for i in indices])
        if served is not None:
            return served
        if failed is None:  # no trial can go better (no fork): serve without them
            return None
        _left_out(sock, indices[failed[0]], failed[1])
        del indices[failed[0]]
    return None


def _trial(sock: socket.socket, named: list) -> tuple[int | None, tuple[int, str] | None]:
    """Fork a child that imports ``named`` and serves if that left forking safe: then wait for it
    and return its exit code first. Else the index in ``named`` of the module that made it unsafe
    (or that the child was importing when it ended) and why, second; neither where no trial can go
    better (no fork: the pool is told)."""
    report_r, report_w = os.pipe()
    me = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(report_r)
        os.close(report_w)
        _left_out(sock, -1, f"no child to import the op modules in: {exc}")
        return None, None
    if pid == 0:
        _trial_child(sock, named, report_r, report_w, me)
    os.close(report_w)
    try:
        got = _outcome(report_r, sock)
    finally:
        os.close(report_r)
    if got is None:  # the pool is gone: nothing to serve
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return 0, None
    if "ok" in got:  # it serves: its exit is this process's
        sock.close()
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), None
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if "unsafe" in got:
        return None, (int(got["unsafe"]), str(got["why"]))
    i = int(got.get("trying", 0))
    i = i if 0 <= i < len(named) else 0
    return None, (i, f"importing {named[i].module} ended the process importing it (exit code {code})")


def _left_out(sock: socket.socket, index: int, why: str) -> None:
    why = why if len(why) <= 600 else why[:600] + "..."  # its JSON (6 bytes a char at most) fits the bound
    sock.sendall(message(b"M", json.dumps({"module": index, "why": why})))


# -- serving --------------------------------------------------------------------------------------

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


def _serve(sock: socket.socket) -> int:
    """Say this process's pid and that it is ready, then answer until EOF on ``sock``."""
    signal.signal(signal.SIGCHLD, _reap)
    gc.freeze()  # the imported objects stay out of the children's collections: their pages stay shared
    sock.sendall(MSG.pack(b"I", os.getpid()))  # the workers' parent (this process, or the trial's child)
    sock.sendall(MSG.pack(b"R", int(time.time() * 1e6)))  # when it was ready (the pool knows when it started)
    while True:
        try:
            kind, value, fds = read_message(sock)
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


def main() -> int:
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the children get pipes of their own, never this socket
    os.close(null)
    os.dup2(2, 1)  # prints from imported modules go to stderr, as in a worker
    sys.stdout = sys.stderr
    refusal = _refusal()  # the imports, then whether a fork is safe
    if refusal is not None:
        sock.sendall(message(b"E", refusal))
        return 1
    named = _named()
    if named:
        code = _trials(sock, named)
        if code is not None:  # a trial's child served
            return code if code >= 0 else 128 - code
    return _serve(sock)


if __name__ == "__main__":
    sys.exit(main())
