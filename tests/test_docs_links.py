"""The documentation holds together: links resolve, code citations name real sections.

- every relative link and image in README.md, DEVELOPERS.md and docs/**/*.md points at an
  existing file, and a ``#fragment`` at an existing heading of that file;
- every citation of an engine rule in kvsim/, tests/, bench/ and scripts/
  (``docs/engines/apc.md §3.5``, or the older ``vllm_apc.md §3.5`` / ``sglang_radix.md §5.3``)
  names a section heading that exists in docs/engines/apc.md or docs/engines/radix.md
  (in an engine's scheduler modules, a bare § cites vllm-scheduler.md or sglang-scheduler.md);
- the README stays a front page (under 16 KB).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ROOT / "docs" / "engines"
MARKDOWN = sorted([ROOT / "README.md", ROOT / "DEVELOPERS.md", *(ROOT / "docs").rglob("*.md")])
CODE_DIRS = ("kvsim", "tests", "bench", "scripts")
CODE_SUFFIXES = {".py", ".sh", ".ipynb", ".md", ".txt", ".toml"}

# A citation names the page it refers to; old names map onto the new pages.
PAGES = sorted(p.stem for p in ENGINES.glob("*.md"))
DOC_NAMES = {name: page for page in PAGES
             for name in (f"docs/engines/{page}.md", f"engines/{page}.md", f"{page}.md")}
DOC_NAMES.update({"vllm_apc.md": "apc", "sglang_radix.md": "radix"})
SCHEDULER_PAGES = {"vllm": "vllm-scheduler", "sglang": "sglang-scheduler"}
DOC_MENTION = re.compile(r"[\w./-]*?([\w-]+\.md)")
SECTION_REF = re.compile(r"§\s*(\d+(?:\.\d+)*)")
ENGINE_WORDS = {"apc": re.compile(r"\bvllm|\bapc\b", re.I), "radix": re.compile(r"\bsglang|\bradix", re.I)}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code removed."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield i, re.sub(r"`[^`]*`", "", line)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links -> their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    fenced, out = False, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append(m.group(2))
    return out


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        s = _slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: Path):
    for lineno, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in (*LINK.finditer(line), *HTML_SRC.finditer(line)):
            yield lineno, m.group(1)


def _check_link(md: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http:, https:, mailto:
        return None
    file_part, _, fragment = target.partition("#")
    dest = md if not file_part else (md.parent / file_part).resolve()
    if not dest.exists():
        return f"{file_part} does not exist"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"no heading with anchor #{fragment} in {dest.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_images_resolve(md):
    """Every relative link or image of a page names an existing file (and heading)."""
    bad = [f"{md.relative_to(ROOT)}:{n}: ({t}) {err}"
           for n, t in links(md) if (err := _check_link(md, t))]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_links_and_anchors():
    """The link pattern and the anchor rule work on the pages' own shapes."""
    md = ROOT / "README.md"
    targets = [t for _, t in links(md)]
    assert "docs/images/demo_capacity.png" in targets and "docs/engines/apc.md" in targets
    assert _slug("3.5 `free(request)` and the eviction order") == "35-freerequest-and-the-eviction-order"
    assert _check_link(md, "docs/engines/apc.md#35-freerequest-and-the-eviction-order") is None
    assert _check_link(md, "docs/engines/apc.md#no-such-heading") is not None
    assert _check_link(md, "docs/no-such-page.md") is not None


def sections(page: str) -> set[str]:
    """The section numbers of an engine page: '## 3. Title' -> '3', '### 3.5 Title' -> '3.5'."""
    out = set()
    for h in headings(ENGINES / f"{page}.md"):
        if m := re.match(r"(\d+(?:\.\d+)*)\.?\s", h):
            out.add(m.group(1))
    return out


def _page_of_mention(name: str) -> str | None:
    """'apc'/'radix' for an engine page, '' for another document, None for no mention."""
    return DOC_NAMES.get(name, "")


def citations(path: Path):
    """(line number, page, section, line) for every § citation of an engine page.

    The page is the document named just before the § on the same line; else, in an
    engine's scheduler modules, its scheduler page; else the engine the line talks about
    (vLLM/APC or SGLang/radix); else the first engine page the file names; else the engine
    the file's path names. Citations of other documents (``traces/README.md §5``) and ones
    that cannot be placed are left out.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    named = f"{path.parent.name}/{path.name}"
    path_page = ("apc" if re.search(r"apc|vllm", named) else
                 "radix" if re.search(r"radix|sglang", named) else None)
    sched = path.parent.name in ("vllm", "sglang") and path.stem in ("scheduler", "adder", "policy")
    if sched and path_page:
        path_page = SCHEDULER_PAGES["vllm" if path_page == "apc" else "sglang"]
    first = next((DOC_NAMES[m.group(1)] for m in DOC_MENTION.finditer(text) if m.group(1) in DOC_NAMES), None)
    file_page = path_page if sched else (first or path_page)
    for lineno, line in enumerate(text.splitlines(), 1):
        mentions = [(m.end(), _page_of_mention(m.group(1))) for m in DOC_MENTION.finditer(line)]
        words = {page for page, rx in ENGINE_WORDS.items() if rx.search(line)}
        for ref in SECTION_REF.finditer(line):
            before = [page for end, page in mentions if end <= ref.start()]
            if before:
                page = before[-1]
            elif sched:
                page = path_page
            elif len(words) == 1 and file_page in (None, "apc", "radix"):
                page = next(iter(words))
            else:
                page = file_page
            if page:
                yield lineno, page, ref.group(1), line.strip()


def code_files():
    me = Path(__file__).resolve()
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and p.resolve() != me:
                yield p


def test_engine_citations_in_code_name_existing_sections():
    """Every `§N.N` a comment or docstring cites exists on the engine page it cites."""
    known = {page: sections(page) for page in PAGES}
    found, bad = 0, []
    for p in code_files():
        for lineno, page, sec, line in citations(p):
            found += 1
            if sec not in known[page]:
                bad.append(f"{p.relative_to(ROOT)}:{lineno}: {page}.md has no §{sec}: {line}")
    assert found > 50, f"only {found} citations found: the pattern no longer matches the code"
    assert not bad, "\n".join(bad)


def test_citation_placement(tmp_path):
    """Old and new spellings map onto the new pages; other documents are left alone."""
    f = tmp_path / "x_radix.py"
    f.write_text("a (``vllm_apc.md §3.5``) and docs/engines/radix.md §5.3, §1.2\n"
                 "SGLang: rest (spec §6)\n"
                 "see traces/README.md §5\n"
                 "bare §2.1\n")
    got = [(page, sec) for _, page, sec, _ in citations(f)]
    assert got == [("apc", "3.5"), ("radix", "5.3"), ("radix", "1.2"), ("radix", "6"), ("apc", "2.1")]
    assert {"1", "1.1", "3.5", "6", "8"} <= sections("apc")
    assert {"0.1", "1.2", "2.1", "5.3", "7.2", "9"} <= sections("radix")


def test_readme_is_a_front_page():
    """The README stays short; the details live under docs/."""
    size = (ROOT / "README.md").stat().st_size
    assert size < 16 * 1024, f"README.md is {size} bytes; move details into docs/"
