"""Where numba keeps kvsim's compiled kernels, and one note when compiling takes a while.

numba's ``cache=True`` writes a kernel's machine code next to its source (``__pycache__``),
which a site-packages install may not be able to write: every command would then compile
again. kvsim points numba at the user cache folder instead, ``kernels`` in kvsim's folder
(``~/.cache/kvsim/kernels`` on Linux, through ``platformdirs``; ``NUMBA_CACHE_DIR`` wins when
it is set). It does so in one place, :func:`install` (called when :mod:`kvsim` is imported),
at the moment numba is first imported: a command that never loads numba pays nothing.

At that moment it also puts kvsim's cache locator first (:mod:`.locator`: one folder per
kvsim build, the same wherever kvsim is installed) and copies the kernels compiled when the
wheel was built into that folder (:mod:`.prebuilt`), so that a fresh install has nothing to
compile on the commands the build ran.

Other kernels are compiled lazily, when a command first calls them, and then loaded from
that folder by every later process. A kernel loaded from the folder starts only numba's
runtime, not its compiler's tables (:func:`_light_cache_loads`). The first compilation on a machine can take seconds:
when one has been running for :data:`NOTE_AFTER_S`, one line says so on stderr (once a
process). With ``KVSIM_KERNEL_LOG=FILE`` each compilation (each cache miss) appends a line
``module.function<TAB>signature`` to FILE: what tests and the build check with.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

ENV = "NUMBA_CACHE_DIR"
#: a file that gets one line per kernel compilation (tests, the build's check)
LOG_ENV = "KVSIM_KERNEL_LOG"
#: a compilation running this long gets the note (seconds)
NOTE_AFTER_S = 1.0
NOTE = ("note: compiling kvsim's kernels for this machine (once after an install or upgrade; "
        "kept in {folder})")


def kernel_cache_dir() -> Path:
    """The folder numba caches kvsim's kernels in: ``$NUMBA_CACHE_DIR``, else ``kernels``
    in the user cache folder."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kvsim")) / "kernels"


def install() -> None:
    """Point numba's cache at :func:`kernel_cache_dir` and watch its compilations, now if
    numba is already imported, else when it is (an import hook that removes itself)."""
    if "numba" in sys.modules:
        _configure_loaded()
        return
    if not any(isinstance(f, _NumbaImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumbaImportHook())


def _set_cache_dir() -> None:
    if not os.environ.get(ENV):
        os.environ[ENV] = str(kernel_cache_dir())


def _configure_loaded() -> None:
    """numba was imported before kvsim: its config has read the environment already."""
    from numba.core import config

    if not config.CACHE_DIR and not os.environ.get(ENV):
        _set_cache_dir()
        config.CACHE_DIR = os.environ[ENV]
    try:
        _numba_loaded()
    except Exception:  # noqa: BLE001 - as in _AfterExec: never fail the caller over the cache
        pass


class _NumbaImportHook:
    """A meta-path finder for ``numba`` only: sets the cache folder before numba reads its
    environment, and watches compilations once numba is loaded. Used once, then removed."""

    def find_spec(self, name, path=None, target=None):
        if name != "numba":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _set_cache_dir()
        spec = importlib.util.find_spec(name)  # the real finders, this one removed
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader, _numba_loaded)
        return spec


class _AfterExec:
    """A loader that runs ``then()`` after the real loader has executed the module; every
    other attribute is the real loader's."""

    def __init__(self, loader, then) -> None:
        self._loader = loader
        self._then = then

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            self._then()
        except Exception:  # noqa: BLE001 - the cache is a courtesy; never fail numba's import
            pass


def _numba_loaded() -> None:
    """numba has just been imported: kvsim's locator, the shipped kernels, the note."""
    from kvsim.kernels import locator, prebuilt

    _watch_compilations()
    _light_cache_loads()
    locator.install()
    prebuilt.seed_user_cache()


def _light_cache_loads() -> None:
    """Load cached kernels without refreshing numba's whole target context.

    Before loading a kernel from its cache, numba refreshes the target context: it starts its
    runtime (NRT), which the machine code calls, and imports every lowering module it has
    (its array, linear-algebra, random, typed-container and other implementations), which
    only a compilation uses. That import was most of a command's first kernel load (0.1 s of
    0.14-0.17 s on the 2-core machine; docs/performance.md, "Start-up"). Here a load starts
    the runtime only; a compilation still refreshes everything first (numba's
    ``CompilerBase`` does), so a kernel compiled after a load is compiled as before
    (``tests/test_kernel_cache.py``)."""
    from numba.core import caching
    from numba.core.runtime import rtsys

    full = caching.Cache.load_overload
    if getattr(full, "_kvsim_light", False) or not all(
            hasattr(caching.Cache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors")):
        return  # done, or a numba whose cache works otherwise: its own loads

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    load_overload._kvsim_light = True  # type: ignore[attr-defined]
    caching.Cache.load_overload = load_overload


class CompileNote:
    """Listens to numba's ``numba:compile`` events: a compilation (the outermost of nested
    ones) still running after :data:`NOTE_AFTER_S` prints :data:`NOTE`, once a process."""

    def __init__(self) -> None:
        self.depth = 0
        self.timer: threading.Timer | None = None
        self.said = False

    def notify(self, event) -> None:
        if event.is_start:
            self.depth += 1
            if self.depth == 1 and not self.said:
                self.timer = threading.Timer(NOTE_AFTER_S, self.say)
                self.timer.daemon = True
                self.timer.start()
        elif event.is_end:
            self.depth -= 1
            if self.depth == 0 and self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def say(self) -> None:
        if self.said or _silent:
            return
        self.said = True
        try:
            print(NOTE.format(folder=_shown(os.environ.get(ENV) or kernel_cache_dir())), file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


_note: CompileNote | None = None
_silent = False


def silence() -> None:
    """Never print the note in this process (a forked child: its parent says it; kvsim.drive.side)."""
    global _silent
    _silent = True


def _watch_compilations() -> None:
    global _note
    if _note is not None:
        return
    from numba.core import event

    event.Listener.register(CompileNote)  # numba checks isinstance(listener, Listener)
    _note = CompileNote()
    event.register("numba:compile", _note)
    if os.environ.get(LOG_ENV):
        event.Listener.register(CompileLog)
        event.register("numba:compile", CompileLog(os.environ[LOG_ENV]))


class CompileLog:
    """Appends ``module.function<TAB>signature`` to a file at each compilation's start."""

    def __init__(self, path: str) -> None:
        self.path = path

    def notify(self, event) -> None:
        if not event.is_start:
            return
        data = event.data or {}
        func = getattr(data.get("dispatcher"), "py_func", None)
        name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
        try:
            with open(self.path, "a") as f:
                f.write(f"{name}\t{tuple(data.get('args') or ())}\n")
        except OSError:
            pass


def _shown(folder) -> str:
    """The folder as a user reads it (``~`` for the home folder)."""
    text = str(folder)
    home = os.path.expanduser("~")
    return "~" + text[len(home):] if home not in ("", "~", "/") and text.startswith(home + os.sep) else text
