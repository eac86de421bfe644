"""The package map holds (docs/architecture.md): no import cycle between kvsim's packages, only
the commands and the pages draw, folders stay small, and only the engines know engine names."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kvsim"
DRAWING = ("cli", "render", "report")        # the only packages that may import kvsim.render
MAX_MODULES = 16


def _unit(path: Path) -> str:
    """The package a file belongs to (kvsim/<unit>/...), or the top-level module's name."""
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports() -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> files, counting imports inside functions too."""
    out: dict[str, dict[str, set[str]]] = {}
    for f in PKG.rglob("*.py"):
        src = _unit(f)
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "kvsim" and len(parts) > 1 and parts[1] != src:
                    out.setdefault(src, {}).setdefault(parts[1], set()).add(str(f.relative_to(ROOT)))
    return out


def _reaches(graph, a: str, b: str) -> bool:
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            todo.extend(graph.get(x, {}))
    return False


def test_no_import_cycle_between_packages():
    graph = imports()
    cycles = [f"{a} -> {b} ({', '.join(sorted(files))})" for a, edges in graph.items() for b, files in edges.items()
              if _reaches(graph, b, a)]
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_lazy_imports(tmp_path):
    graph = imports()
    assert "engines" in graph["drive"] and "render" in graph["cli"]
    assert _reaches({"a": {"b": set()}, "b": {"a": set()}}, "b", "a")


def test_only_the_commands_and_pages_draw():
    graph = imports()
    drawing = {a: sorted(files) for a, edges in graph.items() for b, files in edges.items()
               if b == "render" and a not in DRAWING}
    assert not drawing, drawing


def test_no_folder_has_more_than_16_modules():
    big = {str(d.relative_to(ROOT)): n for d in [PKG, *PKG.rglob("*")] if d.is_dir() and d.name != "__pycache__"
           and (n := len(list(d.glob("*.py")))) > MAX_MODULES}
    assert not big, big


ENGINE_BRANCH = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](apc|radix|vllm|sglang)["']|["'](apc|radix)["']\s*:\s|"""
                           r"""["'](apc|radix)["']\s+(not\s+)?in\b""")


def engine_branches() -> list[str]:
    """Lines outside kvsim/engines/ that compare with, look up by or test for an engine's name."""
    out = []
    for f in PKG.rglob("*.py"):
        if f.is_relative_to(PKG / "engines"):
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if ENGINE_BRANCH.search(code):
                out.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def test_only_the_registry_knows_the_engines():
    """At most five places outside kvsim/engines/ branch on an engine's name."""
    found = engine_branches()
    assert len(found) <= 5, "\n".join(found)


def test_the_branch_pattern_sees_branches():
    for line in ('if policy == "apc":', 'x = {"apc": 1}', 'if "radix" in names:', "family != 'sglang'"):
        assert ENGINE_BRANCH.search(line), line
    assert not ENGINE_BRANCH.search('replay("apc", trace, options)')
