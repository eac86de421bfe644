"""Every ``docs/engines/routers.md §N`` cited in code names a section of that page."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "engines" / "routers.md"
CITE = re.compile(r"routers\.md §\s*(\d+(?:\.\d+)*)")


def test_router_citations_exist():
    sections = {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)*)\.? ", PAGE.read_text(), re.M)}
    assert {"1", "2.4", "3.3", "9.2"} <= sections
    found, bad = 0, []
    for d in ("kvsim", "tests", "bench", "scripts"):
        for p in (ROOT / d).rglob("*.py"):
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                for m in CITE.finditer(line):
                    found += 1
                    if m.group(1) not in sections:
                        bad.append(f"{p.relative_to(ROOT)}:{n}: §{m.group(1)}")
    assert found > 30 and not bad, (found, bad)
