"""Kernels compiled ahead of time into extension modules, called without importing numba.

Loading numba and its cached kernels costs a command about 0.15 s before it computes
anything: more than the whole timed replay of a thousand Mooncake requests. The kernels of
the readers and the replays (token-id and chat logs, vLLM's sequential, timed and step
replays, on one engine or a fleet; :data:`EXPORTS`) are therefore also
compiled ahead of time by numba's ``pycc`` into ``prebuilt/aot/`` (two extension modules:
the kernels numba compiles without reference counting, and the others), for the argument types
the commands of :data:`kvsim.build_aot.COMMANDS` pass them. A :class:`~kvsim.kernels.jit.Kernel` called
with exactly those types runs that copy; any other call goes to numba as before.

The built module is used only while it matches what is running: the same numpy and Python,
and the same source (a hash of each kvsim module the kernels' modules import, transitively,
recorded at the build: an edited checkout falls back to numba until ``make venv`` builds
again). ``KVSIM_AOT=0`` turns it off; ``KVSIM_AOT_DIR`` loads it from another folder.

Built by ``python -m kvsim.build_aot`` (``make venv``, the wheel's build).

An argument check is exact, as numba's dispatch is: a compiled copy reads an array's memory
as the type it was built for, so a wrong dtype, a non-contiguous or a read-only array must
never reach it (:func:`checker`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

PACKAGE = Path(__file__).resolve().parent.parent
FOLDER = Path(__file__).resolve().parent / "prebuilt" / "aot"
MODULE = "kvsim_aot"              # and kvsim_aot_nrt
META = "aot.json"
ENV = "KVSIM_AOT"
DIR_ENV = "KVSIM_AOT_DIR"         # another folder to load the built module from (tests)
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400      # numpy's array flags (ndarray.flags.num)

#: the kernels built ahead of time: what reading a token-id or chat log calls, vLLM's
#: sequential replay, and everything the timed and step replays of vLLM's scheduler call, on
#: one engine or a fleet (behind any router, Dynamo's included)
EXPORTS = [
    "kvsim.io.readers.token_scan:line_bounds",
    "kvsim.io.readers.token_scan:scan_lines",
    "kvsim.io.tokenize.word_scan:split_words",
    "kvsim.io.tokenize.word_scan:assemble",
    "kvsim.io.tokenize.gather:gather_pieces",
    "kvsim.engines.vllm.hash_kernels:fast_hash_requests",
    "kvsim.engines.vllm.manager_jit:run_sequential",
    "kvsim.engines.vllm.scheduler_jit:run_replay",
    "kvsim.engines.vllm.hash_kernels:hash_requests",
    "kvsim.engines.vllm.manager_jit:lookup",
    "kvsim.engines.vllm.manager_jit:run_unlimited",
    "kvsim.kernels.multiset:_add",
    "kvsim.kernels.multiset:_remove",
    "kvsim.kernels.multiset:_held_prefix",
    "kvsim.kernels.table:rehash",
]

# -- calling the built kernels --------------------------------------------------------------
def entries(kernel) -> list:
    """``[(fits(args), compiled function)]`` built for ``kernel``; empty without a usable build."""
    built = _load()
    if built is None:
        return []
    table, modules = built
    return [(checker(spec), getattr(modules[module], symbol)) for spec, module, symbol in table.get(_name(kernel), ())]


def ready(*names: str) -> bool:
    """Whether calling the kernels ``names`` (``module:function``) imports nothing now: numba
    is imported already, or each has a built copy. (Code that takes a compiled path only where
    it costs no import asks this.)"""
    if "numba" in sys.modules:
        return True
    built = _load()
    return built is not None and all(n in built[0] for n in names)


def _name(kernel) -> str:
    return f"{kernel.__module__}:{kernel.__qualname__}"


_loading = threading.Lock()


@functools.lru_cache(maxsize=1)
def _load():
    """The built module and its kernels' table, or None (none built, stale, or turned off)."""
    with _loading:                  # (the readers call kernels from several threads)
        return _load_now()


def _load_now():
    if os.environ.get(ENV) == "0":
        return None
    folder = Path(os.environ.get(DIR_ENV) or FOLDER)
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("modules"), dict) or not current(meta):
        return None                 # (none, another build's layout, or stale)
    modules = {}
    for name, file in meta["modules"].items():
        spec = importlib.util.spec_from_file_location(name, folder / file)
        try:
            modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[name])
        except (ImportError, OSError):
            return None
    return meta["kernels"], modules


def current(meta: dict) -> bool:
    """Was ``meta``'s build made for this numpy, this Python and these sources?"""
    if meta.get("numpy") != np.__version__ or meta.get("python") != python_version():
        return False
    return meta.get("sources") == source_hashes(meta.get("sources", {}))


def python_version() -> str:
    """This Python's version and ABI flags, as a build records them (``3.11``)."""
    return "{}.{}".format(*sys.version_info[:2]) + getattr(sys, "abiflags", "")


def source_hashes(files) -> dict[str, str]:
    """``{path under kvsim/: sha1 of its bytes}`` (an unreadable file: ``""``)."""
    out = {}
    for rel in files:
        try:
            out[rel] = hashlib.sha1((PACKAGE / rel).read_bytes()).hexdigest()
        except OSError:
            out[rel] = ""
    return out


def checker(spec: list):
    """``fits(args)``: True when ``args`` are exactly the types of ``spec`` (as numba would
    type them: arrays by dtype, dimensions, C order and writability; ints, floats, bools,
    tuples), so that the compiled copy may read them."""
    names: dict[str, object] = {"_nd": np.ndarray}
    conds = [f"len(args) == {len(spec)}"]
    for k, s in enumerate(spec):
        conds.append(_condition(s, f"args[{k}]", names))
    src = "def fits(args):\n    return " + " and ".join(conds) + "\n"
    exec(compile(src, f"<kvsim aot check {spec!r:.60}>", "exec"), names)   # noqa: S102 - generated from the build's types
    return names["fits"]


def _condition(s: list, v: str, names: dict) -> str:
    kind = s[0]
    if kind == "a":                           # ["a", dtype str, ndim, layout C|A, readonly]
        dt = f"_d{len(names)}"
        names[dt] = np.dtype(s[1])
        # flags: writeable (0x400) unless read-only, aligned (0x100), C-contiguous (0x1) for C
        mask = _WRITEABLE | _ALIGNED | (_C_CONTIGUOUS if s[3] == "C" else 0)
        want = mask & ~(_WRITEABLE if s[4] else 0)
        return (f"(type({v}) is _nd and ({v}.dtype is {dt} or {v}.dtype == {dt}) and {v}.ndim == {s[2]} "
                f"and {v}.flags.num & {mask} == {want})")
    if kind == "i":                           # ["i", numpy dtype str]: a Python int is int64
        sc = f"_s{len(names)}"
        names[sc] = np.dtype(s[1]).type
        py = f"type({v}) is int or " if s[1] == "<i8" else ""
        return f"({py}type({v}) is {sc})"
    if kind == "f":                           # ["f", numpy dtype str]: a Python float is float64
        sc = f"_s{len(names)}"
        names[sc] = np.dtype(s[1]).type
        py = f"type({v}) is float or " if s[1] == "<f8" else ""
        return f"({py}type({v}) is {sc})"
    if kind == "b":
        names["_bool_"] = np.bool_
        return f"(type({v}) is bool or type({v}) is _bool_)"
    if kind == "t":                           # ["t", [items]]
        items = [_condition(item, f"{v}[{j}]", names) for j, item in enumerate(s[1])]
        return "(" + " and ".join([f"type({v}) is tuple", f"len({v}) == {len(s[1])}", *items]) + ")"
    raise ValueError(f"unknown argument kind {kind!r}")


# -- building ------------------------------------------------------------------------------
def type_spec(ty) -> list | None:
    """A numba type as :func:`checker` reads it (None: not built ahead of time)."""
    from numba.core import types

    if isinstance(ty, types.Array) and ty.layout in "CA":
        return ["a", np.dtype(str(ty.dtype)).str, ty.ndim, ty.layout, bool(not ty.mutable)] if ty.aligned else None
    if isinstance(ty, types.Boolean):
        return ["b"]
    if isinstance(ty, types.Integer):
        return ["i", np.dtype(str(ty)).str]
    if isinstance(ty, types.Float):
        return ["f", np.dtype(str(ty)).str]
    if isinstance(ty, types.BaseTuple):
        items = [type_spec(t) for t in ty.types]
        return None if any(i is None for i in items) else ["t", items]
    return None


def kernel_sources(modules) -> list[str]:
    """The kvsim modules ``modules`` import at their top level, transitively (``modules``
    included), as paths under kvsim/."""
    import ast

    seen: dict[str, str] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin).resolve()
        seen[name] = path.relative_to(PACKAGE).as_posix()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvsim":
                todo.append(node.module)
                todo.extend(f"{node.module}.{a.name}" for a in node.names
                            if importlib.util.find_spec(node.module).submodule_search_locations)
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names if a.name.split(".")[0] == "kvsim")
    return sorted(seen.values())
