"""Old option names that still work: each is rewritten to its new name before parsing, with
a one-line note on stderr, so users' scripts keep running. They are not in ``--help``."""
from __future__ import annotations

from collections.abc import Callable

#: old name -> new name (the same meaning in every command)
RENAMED = {
    "--eviction-policy": "--eviction",      # "policy" now means only the cache design (apc, radix)
    "--capacity-tokens": "--capacity",      # one capacity option everywhere (tokens, inf or memory)
    "--engine": "--implementation",         # "engine" means vLLM / SGLang; fast or reference is an implementation
}


def apply_aliases(argv: list[str], note: Callable[[str], None]) -> list[str]:
    """``argv`` with every renamed option under its new name (``--old v`` and ``--old=v``);
    ``note`` is called once per old name used. Nothing after ``--`` is touched."""
    out, seen = [], set()
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        name, eq, value = arg.partition("=")
        new = RENAMED.get(name)
        if new is not None:
            if name not in seen:
                note(f"note: {name} is deprecated; use {new}")
                seen.add(name)
            arg = new + eq + value
        out.append(arg)
    return out
