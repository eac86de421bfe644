"""Replays beside the main one, on another core.

A timed replay also replays the same load without prefix caching (and, with an offload tier,
without the tier): the time the cache saves. Those replays share nothing with the main one but
its inputs, so where the platform forks and a second core is free, each runs in a child
process made by ``os.fork`` (the inputs are the parent's memory, not copied) while the parent
replays; the child sends its result back pickled. A core is free while the process's running
side children number fewer than its cores less one: side work started while the others hold
every core runs in the parent (a fleet's bounds, beside its replay without prefix caching). Elsewhere, or with ``KVSIM_SIDE_PROCESSES=0``,
they run in turn after the main replay, as before. The results are the same either way
(``tests/test_side_replays.py``). The fleet's bounds and the report's charts (every other
PNG) are computed beside the caller the same way.

A forked child holds only the thread that forked. Should another thread of the parent have
held a lock at that moment (an import's, say) that the child then needs, the child would wait
for ever; so while the parent waits for a result it watches the child's CPU time, and a child
that has used none for :data:`STALL_S` seconds while sending nothing is stopped and its work
done in the parent instead.
"""
from __future__ import annotations

import os
import pickle
import select
import sys
import warnings
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

#: set to 0 to run the side replays in turn, in this process
ENV = "KVSIM_SIDE_PROCESSES"
#: a child that has used no CPU time for this long, sending nothing, is taken as stuck
STALL_S = 5.0


def can_fork() -> bool:
    """Whether side work runs in a forked child: Linux, two cores or more for this process."""
    return _cores() >= 2


def _cores() -> int:
    """The cores this process may use where side work may fork (else 0)."""
    if os.environ.get(ENV, "1") == "0" or sys.platform != "linux" or not hasattr(os, "fork"):
        return 0
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return 0


#: side children of this process still running (each holds a core)
_running = 0


class Side(Generic[T]):
    """``fn(here)`` computed beside the caller: :meth:`result` returns its value (or raises
    its exception), from a child process when :func:`can_fork`, else by calling it then.
    ``here`` is False in the child (which must not draw on the terminal). Used in a ``with``
    block, a child whose result was not taken (the caller failed) is stopped at its end."""

    def __init__(self, fn: Callable[[bool], T]) -> None:
        self._fn: Callable[[bool], T] | None = fn
        self._pid = 0
        self._fd = -1
        if _cores() > 1 + _running:      # a core free of this process and its running children
            self._fork()

    def _fork(self) -> None:
        global _running
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, and leave without running the parent's exit code
            os.close(read)
            _run_child(self._fn, write)
        os.close(write)
        self._pid, self._fd = pid, read
        _running += 1

    def result(self) -> T:
        fn, self._fn = self._fn, None
        if fn is None or self._pid < 0:
            raise RuntimeError("Side.result() called twice, or after cancel()")
        if self._pid == 0:
            return fn(True)
        try:
            data = self._receive()
        finally:
            self._reap()
        if data is None:  # the child died before sending (killed, out of memory) or was stuck: do it here
            return fn(True)
        try:
            ok, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 (an exception whose class cannot be rebuilt from its args)
            return fn(True)  # here it raises as it would have
        if ok:
            return value
        raise value

    def _receive(self) -> bytes | None:
        """The child's whole message; None if it ended without one or stalled (then stopped)."""
        chunks: list[bytes] = []
        cpu, idle = _cpu_ticks(self._pid), 0.0
        while True:
            ready, _, _ = select.select([self._fd], [], [], _POLL_S)
            if ready:
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks) or None
                chunks.append(chunk)
                idle = 0.0
                continue
            now = _cpu_ticks(self._pid)
            if now is None or now != cpu:
                cpu, idle = now, 0.0
                continue
            idle += _POLL_S
            if idle >= STALL_S:
                self.cancel()
                return None

    def __enter__(self) -> "Side[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop the child, if one runs (the caller no longer needs the result)."""
        if self._pid > 0:
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:
                pass
            self._reap()

    def _reap(self) -> None:
        global _running
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._pid > 0:
            try:
                os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = -1  # reaped: result() no longer runs fn
            _running -= 1


#: how often a waiting parent looks at the child's CPU time (seconds)
_POLL_S = 0.25


def _cpu_ticks(pid: int) -> int | None:
    """User + system clock ticks of process ``pid`` so far (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])   # utime, stime (proc(5), fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return None


def _run_child(fn: Callable[[bool], object] | None, fd: int) -> None:
    code = 0
    try:
        # Nothing from the child reaches the terminal, and nothing waits on a lock of the
        # parent's streams that another thread (a progress bar's) held at the fork.
        sys.stdout = sys.stderr = open(os.devnull, "w")
        warnings.simplefilter("ignore")
        from kvsim.kernels import compile_cache

        compile_cache.silence()  # the parent says it if a compilation is slow, once
        try:
            payload = pickle.dumps((True, fn(False)), pickle.HIGHEST_PROTOCOL)  # type: ignore[misc]
        except BaseException as e:  # noqa: BLE001 (sent to the parent, which raises it)
            try:
                payload = pickle.dumps((False, e), pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 (an exception that does not pickle)
                payload = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:  # noqa: BLE001 (nothing sent: the parent computes it itself)
        code = 1
    finally:
        os._exit(code)
