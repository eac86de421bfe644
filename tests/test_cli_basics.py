"""The CLI skeleton: help, version, usage errors, and no dependency on packages kvsim does not declare."""
import subprocess
import sys

from kvsim import __version__
from kvsim.cli import run


def test_help_lists_the_commands(capsys):
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("inspect", "generate", "analyze", "simulate", "capacity", "sweep", "report", "gpu-validate"):
        assert command in out


def test_version(capsys):
    assert run(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_usage_errors_exit_2_without_traceback(capsys):
    assert run(["simulate", "--no-such-option"]) == 2
    assert run(["no-such-command"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_imports_without_click():
    """Typer >= 0.2x vendors click: kvsim must not import click, which a plain install lacks."""
    code = ("import sys; sys.modules['click'] = None\n"
            "from kvsim.cli import run\n"
            "sys.exit(run(['simulate', '--no-such-option']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
