"""Where numba keeps one of kvsim's kernels: a path that does not depend on where kvsim is
installed, so that kernels compiled when the wheel was built (:mod:`.prebuilt`) are found
by every copy of that build.

numba's own locator for ``NUMBA_CACHE_DIR`` names a module's cache folder after a hash of
the module's absolute folder: kernels compiled in the build folder would never be found in
site-packages. :class:`KvsimCacheLocator` (tried before numba's locators, for kvsim's own
source files only) names it after the module's folder *relative to the kvsim package*,
under one folder per kvsim build (:func:`build_tag`):

    <kernel_cache_dir()>/<build tag>/io/readers/token_scan.scan_lines-254.py311.nbi

What numba checks is unchanged: the index is stamped with a SHA-256 of the source file's
content (so an install's new file times do not matter) and keyed by the signature, the
machine (target, CPU name and features) and the bytecode; numba's version is in the index.

The build tag is the shipped manifest's (``<version>-<hash of kvsim's sources>``): two
installs of one build share their kernels, another build never meets them (numba's stamp
covers a kernel's own file only, not the kernels it calls in other files, so one folder per
build keeps an upgrade from loading a kernel compiled against the old callees). A checkout
or an editable install has no manifest: its tag is ``src-`` and a hash of its absolute
folder, as numba's own locator keeps checkouts apart.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

#: kvsim's package folder (the modules whose kernels this locator places)
PACKAGE = Path(__file__).resolve().parent.parent


def build_tag() -> str:
    """The folder of this kvsim build's kernels under :func:`kernel_cache_dir`."""
    from kvsim.kernels import prebuilt

    shipped = prebuilt.manifest()
    if shipped is not None:
        return shipped["tag"]
    return "src-" + hashlib.sha1(str(PACKAGE).encode()).hexdigest()[:16]


def kernel_root() -> Path:
    """Where this build's kernels are cached: ``<kernel_cache_dir()>/<build_tag()>``."""
    from kvsim.kernels.compile_cache import kernel_cache_dir

    return kernel_cache_dir() / build_tag()


def relative_folder(py_file: str | os.PathLike) -> Path | None:
    """A source file's folder relative to the kvsim package (None: not a kvsim module)."""
    try:
        return Path(py_file).resolve().parent.relative_to(PACKAGE)
    except (ValueError, OSError):
        return None


@functools.lru_cache(maxsize=None)
def _content_hash(path: str, mtime: float, size: int) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _locator_class():
    """The locator class, built on numba's base classes (numba is imported by then)."""
    from numba.core import caching

    class KvsimCacheLocator(caching._CacheLocator):
        """numba's cache locator for functions in kvsim's own modules (see the module's
        docstring); any other function falls through to numba's locators."""

        def __init__(self, py_func, py_file, folder: Path) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(kernel_root() / folder)

        def get_cache_path(self) -> str:
            return self._cache_path

        def get_source_stamp(self) -> bytes:
            # the content's hash, as numba >= 0.61 stamps it (older ones used the file time)
            st = os.stat(self._py_file)
            return _content_hash(self._py_file, st.st_mtime, st.st_size)

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            folder = relative_folder(py_file) if os.path.exists(py_file) else None
            if folder is None:
                return None
            self = cls(py_func, py_file, folder)
            try:
                self.ensure_cache_path()
            except OSError:  # not writable: numba's own locators decide
                return None
            return self

    return KvsimCacheLocator


_installed = None


def install() -> None:
    """Put :class:`KvsimCacheLocator` first in numba's locators (once a process)."""
    global _installed
    if _installed is not None:
        return
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    _installed = _locator_class()
    impl._locator_classes = [_installed, *impl._locator_classes]


def locator_for(func):
    """The locator numba uses for a kvsim kernel (a dispatcher or its Python function)."""
    from numba.core import caching

    py_func = getattr(func, "py_func", func)
    impl = caching.CompileResultCacheImpl(py_func)
    return impl.locator
