"""Build the replays' kernels ahead of time (:mod:`kvsim.kernels.aot`): ``make venv`` and the
wheel's build run it.

    python -m kvsim.build_aot [OUT]      (default: kvsim/kernels/prebuilt/aot)

The kernels' argument types are those the commands of :data:`COMMANDS` give them (numba
records each signature it compiles), on the generated logs of :func:`kvsim.precompile.write_inputs`;
every signature of every kernel of :data:`kvsim.kernels.aot.EXPORTS` is then compiled by
numba's ``pycc`` into one extension module, with ``aot.json``: the module's file, numpy's and
Python's versions, the hashes of the sources it was built from, and per kernel its
signatures (as :func:`kvsim.kernels.aot.checker` reads them) and their symbols.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from kvsim import precompile
from kvsim.cli import run
from kvsim.kernels import aot
from kvsim.kernels.jit import Kernel

_TIMED = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB", "--num-gpu-blocks", "2000"]
#: the commands whose argument types are built (on :func:`kvsim.precompile.write_inputs`' logs)
COMMANDS = [
    ["simulate", *_TIMED, "--policy", "apc", "{hash_ids}"],
    ["simulate", *_TIMED, "--policy", "apc", "{tokens}"],
    ["simulate", "--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05", "--policy", "apc",
     "--capacity", "20000", "{tokens}"],
    *(["simulate", *_TIMED, "--policy", "apc", "--replicas", "4", "--router", router, "{hash_ids}"]
      for router in ("dynamo", "round_robin")),
    ["--no-trace-cache", "simulate", "--policy", "apc", "--capacity", "1000000", "{tokens}"],
    ["--no-trace-cache", "inspect", "{chat}"],
]


def _kernel(name: str):
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


def _kernel_modules() -> set[str]:
    """The kvsim modules holding a kernel that the build compiled or loaded (the exports and
    what they call): their source is the built code's, wherever its Python function lives
    (``rules_jit`` makes kernels of ``rules``' functions)."""
    return {name for name, module in list(sys.modules.items()) if name.startswith("kvsim.")
            and any(isinstance(v, Kernel) and v._dispatcher is not None for v in vars(module).values())}


@contextlib.contextmanager
def _entry_flags(nrt: bool):
    """pycc compiles every export of a module with one set of flags (made in its
    ``ModuleCompiler``); while this is open, those flags release the GIL (as the readers'
    ``nogil`` kernels do: the readers call them from several threads) and count references
    only where ``nrt``. The module itself is always built with numba's runtime linked in: a
    kernel loaded from numba's cache calls the runtime's functions even where it counts no
    references."""
    from numba.pycc import compiler

    base = compiler.Flags

    class Flags(base):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.release_gil = True

        def __setattr__(self, name, value):
            super().__setattr__(name, value and nrt if name == "nrt" else value)

    compiler.Flags = Flags
    try:
        yield
    finally:
        compiler.Flags = base


def _importable(path: Path) -> str | None:
    """Why the built module at ``path`` does not import in a fresh process (None: it does)."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2]); "
            "s.loader.exec_module(importlib.util.module_from_spec(s))")
    done = subprocess.run([sys.executable, "-c", code, path.name.split(".")[0], str(path)], capture_output=True,
                          text=True)
    return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def build(out: Path = aot.FOLDER) -> dict:
    """Run :data:`COMMANDS` (numba, this build turned off), then compile every signature they
    gave the kernels of :data:`kvsim.kernels.aot.EXPORTS` into ``out`` (the module and ``aot.json``)."""
    os.environ[aot.ENV] = "0"                 # the commands run numba's kernels, recording their types
    aot._load.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # pycc's pending deprecation: it is what numba offers
        from numba.pycc import CC

    with tempfile.TemporaryDirectory(prefix="kvsim-aot-") as tmp, open(os.devnull, "w") as quiet:
        logs = precompile.write_inputs(Path(tmp))
        for cmd in COMMANDS:
            args = [a.format(**{k: str(v) for k, v in logs.items()}) for a in cmd]
            with contextlib.redirect_stdout(quiet):
                rc = run(args)
            if rc not in (0, None):
                raise RuntimeError(f"kvsim {' '.join(args)} failed ({rc})")
    # two modules: kernels numba compiles without reference counting (``_nrt=False``, the
    # replays' loops) and the others, with it (those that allocate need it), each as numba does
    modules = {False: CC(aot.MODULE), True: CC(aot.MODULE + "_nrt")}
    for cc in modules.values():
        cc.output_dir = str(out)    # (for the architecture's generic CPU: a wheel runs on any machine of it)
    table: dict[str, list] = {}
    count = 0
    for name in aot.EXPORTS:
        kernel = _kernel(name)
        cc = modules[kernel.options.get("_nrt", True)]
        for sig in kernel.dispatcher.signatures:
            spec = [aot.type_spec(t) for t in sig]
            if any(s is None for s in spec):
                continue
            symbol = f"{name.split(':')[1].lstrip('_')}_{count}"
            count += 1
            cc.export(symbol, kernel.dispatcher.overloads[sig].signature)(kernel.py_func)
            table.setdefault(name, []).append([spec, cc.name, symbol])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{aot.MODULE}*"):
        old.unlink()
    files = {}
    for nrt, cc in modules.items():
        with _entry_flags(nrt):
            cc.compile()
        built = next(out.glob(f"{cc.name}.*"))
        why = _importable(built)
        if why is not None:
            raise RuntimeError(f"the built module {built.name} does not import: {why}")
        files[cc.name] = built.name
    meta = {"modules": files, "numpy": np.__version__, "python": aot.python_version(),
            "sources": aot.source_hashes(aot.kernel_sources(sorted({n.split(":")[0] for n in aot.EXPORTS}
                                                                   | _kernel_modules()))),
            "kernels": table}
    (out / aot.META).write_text(json.dumps(meta, indent=1))
    return meta


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else aot.FOLDER
    t = time.perf_counter()
    meta = build(out)
    n = sum(len(v) for v in meta["kernels"].values())
    print(f"kvsim: {n} kernel signatures built ahead of time into {out} in {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
