"""kvsim's command line. Each command lives in its own module and only parses options;
the work is done by the library. Errors the user can fix exit with code 2 and one line."""
from __future__ import annotations

import importlib
import os
import sys

# Before numpy loads: kvsim's commands do no BLAS work worth a thread, and OpenBLAS's idle
# threads spun on the cores a command's reading threads need (docs/performance.md,
# "Start-up"). A value the user sets is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer  # noqa: E402
from rich.markup import escape  # noqa: E402

from kvsim import progress  # noqa: E402
from kvsim.cli.app import app, err_console  # noqa: E402
from kvsim.errors import KvsimError  # noqa: E402
from kvsim.render.progress import Bars  # noqa: E402

progress.install(Bars)   # the library reports progress; the commands draw it

# Command modules register themselves on `app` when imported. A module that is not
# present yet (a feature not built) is simply absent from --help.
_COMMAND_MODULES = ("inspect", "generate", "analyze", "simulate", "capacity", "sweep", "report", "gpu_validate",
                    "serve", "convert", "cache")
for _name in _COMMAND_MODULES:
    if importlib.util.find_spec(f"kvsim.cli.{_name}") is not None:
        importlib.import_module(f"kvsim.cli.{_name}")


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Typer's usage-error classes: recent Typer vendors click, older ones use click itself."""
    types: list[type[BaseException]] = []
    if hasattr(typer, "TyperException"):
        types.append(typer.TyperException)
    try:
        import click

        types.append(click.ClickException)
    except ImportError:
        pass
    return tuple(types)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` and return the exit code (used by ``main`` and tests)."""
    from kvsim.cli.aliases import apply_aliases

    command = typer.main.get_command(app)
    argv = apply_aliases(list(sys.argv[1:] if argv is None else argv),
                         lambda line: err_console.print(line, highlight=False, markup=False, soft_wrap=True))
    try:
        rv = command.main(args=argv, prog_name="kvsim", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except _usage_error_types() as e:
        e.show()
        return e.exit_code
    except KvsimError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0


def main() -> None:
    exit_now(run(sys.argv[1:]))


def exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, which took about half
    a second once numba's kernels, pandas and a tokenizer were loaded (freeing every module
    and object): the output is flushed, the trace cache's writer is waited for, the exit
    handlers run (atexit: temporary folders, logging, process pools), then ``os._exit``."""
    import atexit
    import os

    store = sys.modules.get("kvsim.io.trace.cache")
    if store is not None:
        store.wait_for_stores()
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:  # not CPython: the usual exit
        sys.exit(code)
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (kvsim ... | head): nothing more to say
            pass
    os._exit(code)
