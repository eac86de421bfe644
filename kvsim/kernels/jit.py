"""kvsim's ``njit``: numba's, made when first needed, and the ahead-of-time copy where one fits.

A module of kernels writes ``from kvsim.kernels.jit import njit`` and decorates as with
numba (``@njit(cache=True)``, ``njit(inline="always")(fn)``). Importing it does not import
numba: each decorated function is a :class:`Kernel`, which makes numba's dispatcher the
first time something needs it. Calling a kernel runs, in this order:

1. the copy compiled ahead of time for exactly these argument types (:mod:`.aot`: built by
   ``make venv`` and into the wheel; one check of the arguments' types a call), without
   loading numba at all;
2. else numba's dispatcher, as ``numba.njit`` would (its cache, or a compilation).

Inside compiled code a kernel calls another as numba's dispatchers do: numba types a
:class:`Kernel` by its dispatcher's type (``_numba_type_``) and reads its options and
Python function through it (inlining).
"""
from __future__ import annotations

from typing import Any, Callable


class Kernel:
    """One numba kernel: its Python function and ``njit`` options, its dispatcher made on
    first need, and its ahead-of-time copies found on first call."""

    def __init__(self, py_func: Callable, options: dict[str, Any]):
        self.py_func = py_func
        self.options = options
        self._dispatcher = None
        self._aot = None                 # [(argument check, compiled function)], found on the first call
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__module__ = py_func.__module__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func

    @property
    def dispatcher(self):
        """numba's dispatcher for this function (numba imported on first use)."""
        d = self._dispatcher
        if d is None:
            import numba

            d = self._dispatcher = numba.njit(**self.options)(self.py_func)
        return d

    @property
    def _numba_type_(self):
        return self.dispatcher._numba_type_

    def __call__(self, *args, **kwargs):
        aot = self._aot
        if aot is None:
            from kvsim.kernels import aot as _aot

            aot = self._aot = _aot.entries(self)
        if not kwargs:                   # (a built copy takes its arguments in order)
            for fits, fn in aot:
                if fits(args):
                    return fn(*args)
        return self.dispatcher(*args, **kwargs)

    def __getattr__(self, name: str):
        # everything else numba's dispatchers offer (signatures, targetoptions, ...)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __repr__(self) -> str:
        return f"<kvsim kernel {self.__module__}.{self.__qualname__}>"


def njit(fn: Callable | None = None, **options):
    """``numba.njit`` without importing numba: ``@njit``, ``@njit(cache=True, ...)`` or
    ``njit(**options)(fn)`` give a :class:`Kernel`."""
    if fn is not None:
        return Kernel(fn, options)
    return lambda f: Kernel(f, options)
