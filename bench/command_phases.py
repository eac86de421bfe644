"""Run one ``kvsim`` command and write where its time went (used by bench_commands.py).

    python bench/command_phases.py OUT.json KVSIM-ARGS...

The command runs as ``kvsim`` runs it (``kvsim.cli.run``); functions of each stage are wrapped
to time them (wall seconds, inclusive; the numba import and kernel loading on any thread),
and the process ends as the ``kvsim`` script ends it.
OUT.json holds the phases and ``in_process_s``, the time from this script's first line to
the command's end (the caller adds the interpreter's own start-up from the process's wall
time).
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections import defaultdict  # noqa: E402

phases: dict[str, float] = defaultdict(float)
first_call: list[float] = []

# (module, attribute, phase): functions looked up through their module at call time
WRAPPED = [
    ("kvsim.io.load", "load_trace", "read"),
    ("kvsim.io.tokenize.tokenizers", "load_tiktoken_encoding", "read: tokenizer load"),
    ("kvsim.io.trace.cache", "lookup", "read: trace cache lookup"),
    ("kvsim.drive.simulate", "run_simulation", "replay"),
    ("kvsim.drive.concurrent", "run_concurrent", "replay"),
    ("kvsim.fleet.concurrent", "run_fleet_concurrent", "replay"),
    ("kvsim.outputs", "write_jsonl", "per-request file"),
    ("kvsim.outputs", "write_json", "summary file"),
]


def _timed(fn, phase):
    def run(*args, **kw):
        if not first_call:
            first_call.append(time.perf_counter())
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            phases[phase] += time.perf_counter() - t
    run.__wrapped__ = fn
    return run


def _wrap_modules() -> None:
    for module, attr, phase in WRAPPED:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, attr):
            setattr(mod, attr, _timed(getattr(mod, attr), phase))
    from kvsim.io.trace import cache

    store, content_hash = cache.PendingStore.store, cache.content_hash

    def timed_store(self, trace, **kw):
        t = time.perf_counter()
        if kw.get("wait", True):
            self._thread.join()
            phases["trace cache store: waiting for the content hash"] += time.perf_counter() - t
            t = time.perf_counter()
        try:
            return store(self, trace, **kw)
        finally:
            phases["trace cache store: writing (or starting its thread)"] += time.perf_counter() - t

    def timed_hash(path):
        t = time.perf_counter()
        try:
            return content_hash(path)
        finally:
            phases["trace cache: content hash (its own thread)"] += time.perf_counter() - t

    cache.PendingStore.store = timed_store
    cache.content_hash = timed_hash


class _NumbaTimer:
    """Times numba's import, then every outermost kernel load or compilation (any thread)."""

    def find_spec(self, name, path=None, target=None):
        if name != "numba":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader

        class Loader:
            def __getattr__(self, attr):
                return getattr(real, attr)

            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                t = time.perf_counter()
                real.exec_module(module)
                phases["numba import"] += time.perf_counter() - t
                _time_dispatchers()

        spec.loader = Loader()
        return spec


_depth = threading.local()


def _time_dispatchers() -> None:
    from numba.core.dispatcher import Dispatcher

    compile_ = Dispatcher.compile

    def timed_compile(self, sig):
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        t = time.perf_counter()
        try:
            return compile_(self, sig)
        finally:
            _depth.n = depth
            if depth == 0:
                phases["kernels: load from cache or compile"] += time.perf_counter() - t

    Dispatcher.compile = timed_compile


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)     # the usage line (not an output named "--help")
        return 2
    out, argv = sys.argv[1], sys.argv[2:]
    sys.meta_path.insert(0, _NumbaTimer())
    t = time.perf_counter()
    import kvsim.cli

    phases["import kvsim.cli"] = time.perf_counter() - t
    _wrap_modules()
    rc = kvsim.cli.run(argv)
    end = time.perf_counter()
    result = {"rc": rc, "in_process_s": end - T0, "ended_at": time.time(), "phases": dict(phases), "kvsim": kvsim.cli.__file__,
              "before_first_stage_s": (first_call[0] - T0) if first_call else None}
    with open(out, "w") as f:
        json.dump(result, f)
    finish = getattr(kvsim.cli, "exit_now", None)  # end the process as the kvsim script does
    if finish is not None:
        finish(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
