"""The one place that knows which engines exist.

The built-in engines are vLLM's APC (``apc``) and SGLang's RadixAttention (``radix``). More
come from plugins: an installed package that declares an entry point in the group
``kvsim.engines`` (``name = "module:SpecClass"``), or ``--engine-plugin module:SpecClass``
(:func:`load_plugin`; ``KVSIM_ENGINE_PLUGINS`` holds the same, comma-separated, for the
processes a command starts). A plugin is an :class:`~kvsim.engines.spec.EngineSpec`
subclass; ``examples/engines/lfu.py`` is one.
"""
from __future__ import annotations

import os
from difflib import get_close_matches

from kvsim.engines.spec import IMPLEMENTATIONS, EngineSpec, load
from kvsim.errors import ConfigError

__all__ = ["IMPLEMENTATIONS", "engine", "engines", "load_plugin", "names", "resolve_policies", "extra_keys"]

BUILTIN = {"apc": "kvsim.engines.vllm.spec:APC", "radix": "kvsim.engines.sglang.spec:RADIX"}
PLUGINS_ENV = "KVSIM_ENGINE_PLUGINS"
ENTRY_POINT_GROUP = "kvsim.engines"
_specs: dict[str, EngineSpec] = {}
_loaded = False


def _register(spec: EngineSpec, where: str) -> None:
    if not isinstance(spec, EngineSpec) or not spec.name:
        raise ConfigError(f"engine plugin {where}: not an EngineSpec with a name")
    if spec.name in _specs and type(_specs[spec.name]) is not type(spec):
        raise ConfigError(f"engine plugin {where}: the name {spec.name!r} is taken")
    _specs[spec.name] = spec


def load_plugin(path: str) -> EngineSpec:
    """Register the engine ``module:SpecClass`` (or ``module:instance``, or ``file.py:SpecClass``);
    returns its spec."""
    where, _, attr = path.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"--engine-plugin takes module:Class or file.py:Class, got {path!r}")
    try:
        obj = getattr(_import(where), attr)
    except (ImportError, AttributeError, OSError) as e:
        raise ConfigError(f"--engine-plugin {path}: {e}") from None
    spec = obj() if isinstance(obj, type) else obj
    _ensure()
    _register(spec, path)
    plugins = [p for p in os.environ.get(PLUGINS_ENV, "").split(",") if p]
    if path not in plugins:
        os.environ[PLUGINS_ENV] = ",".join([*plugins, path])
    return spec


def _import(where: str):
    """A module by name, or a plugin file by path (imported under a name of its own)."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if not where.endswith(".py"):
        return importlib.import_module(where)
    file = Path(where).resolve()
    name = f"kvsim_plugin_{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, file)
    if found is None or not file.exists():
        raise ImportError(f"no plugin file {where}")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    found.loader.exec_module(module)
    return module


def _ensure() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, path in BUILTIN.items():
        _specs[name] = load(path)
    for ep in _entry_points(ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not break kvsim
            raise ConfigError(f"engine plugin {ep.name} ({ep.value}): {e}") from None
        _register(obj() if isinstance(obj, type) else obj, ep.value)
    for path in filter(None, os.environ.get(PLUGINS_ENV, "").split(",")):
        load_plugin(path)


def _entry_points(group: str) -> list:
    """The installed entry points of ``group``. importlib.metadata takes 10-20 ms to import
    and scan every installed package; when no package on ``sys.path`` names the group in its
    ``entry_points.txt`` (:func:`_group_named`), there are none and it is not imported."""
    if not _group_named(group):
        return []
    from importlib.metadata import entry_points

    return list(entry_points(group=group))


def _group_named(group: str) -> bool:
    """Whether some distribution may declare ``group``: an ``entry_points.txt`` of a
    ``*.dist-info`` / ``*.egg-info`` folder on ``sys.path`` holds ``[group]``; True too where
    distributions may be found elsewhere (a zip on the path, a finder of its own on
    ``sys.meta_path``), so that importlib.metadata decides."""
    import sys
    from importlib.machinery import PathFinder

    header = f"[{group}]"
    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return True
    for entry in sys.path:
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):
                return True     # a zip or egg file: importlib.metadata reads those
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.lower().endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(folder, name, "entry_points.txt"), encoding="utf-8") as f:
                    if header in f.read():
                        return True
            except OSError:     # no entry points, or an egg-info file
                continue
    return False


def engines() -> list[EngineSpec]:
    """Every engine, built-ins first."""
    _ensure()
    return list(_specs.values())


def names() -> list[str]:
    """The ``--policy`` values, in order."""
    return [s.name for s in engines()]


def engine(name: str) -> EngineSpec:
    """The engine called ``name``, or a clear error."""
    _ensure()
    if name not in _specs:
        near = get_close_matches(str(name), list(_specs), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"unknown policy {name!r}{hint}; choose from {', '.join(_specs)} or 'all'")
    return _specs[name]


def resolve_policies(spec: str) -> list[str]:
    """'apc', 'radix', 'apc,radix' or 'all' -> list of engine names."""
    if spec.strip() == "all":
        return names()
    found = [s.strip() for s in spec.split(",") if s.strip()]
    for n in found:
        engine(n)
    return found


def extra_keys() -> tuple[str, ...]:
    """The ``SimOptions.extra`` keys some engine reads."""
    return tuple(dict.fromkeys(k for s in engines() for k in s.extra_keys))
