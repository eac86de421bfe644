"""One self-contained HTML page: inline CSS, PNGs embedded as base64, no script, no network.

A Content-Security-Policy in the page forbids every external resource, so a page that
tried to load one would show it (and the browser test would catch it).
"""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Iterable

from kvsim.report.document import Chart, ReportData, Section, Table

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
:root { --apc: #2563a8; --radix: #d9661f; --ink: #1f2933; --muted: #5f6b7a; --line: #e3e7ec; }
* { box-sizing: border-box; }
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink);
       margin: 0; background: #f6f7f9; line-height: 1.45; }
main { max-width: 1000px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 1.6rem; margin: 0 0 4px; }
h2 { font-size: 1.2rem; margin: 36px 0 8px; padding-top: 8px; border-top: 1px solid var(--line); }
.subtitle { color: var(--muted); margin: 0 0 16px; font-size: 0.92rem; }
nav { font-size: 0.85rem; margin: 8px 0 20px; color: var(--muted); }
nav a { color: var(--apc); text-decoration: none; margin-right: 12px; white-space: nowrap; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; background: #fbfcfd; }
.card .label { font-size: 0.78rem; text-transform: uppercase; letter-spacing: 0.04em; color: var(--muted); }
.card .value { font-size: 1.45rem; font-weight: 650; margin: 2px 0; }
.card .detail { font-size: 0.82rem; color: var(--muted); }
figure { margin: 16px 0 20px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; display: block; }
figcaption { font-size: 0.9rem; color: var(--ink); margin-top: 6px; max-width: 880px; }
figcaption .png { color: var(--muted); font-size: 0.8rem; }
table { border-collapse: collapse; font-size: 0.84rem; margin: 10px 0 18px; width: 100%; }
caption { text-align: left; font-size: 0.85rem; color: var(--muted); padding-bottom: 4px; caption-side: top; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f6; font-weight: 600; }
tr:nth-child(even) td { background: #fafbfc; }
td { overflow-wrap: anywhere; }
ul { padding-left: 20px; }
li { margin: 3px 0; }
.notes { font-size: 0.85rem; color: var(--muted); }
section#gpu-validate h2 { border-top: none; margin-top: 8px; font-size: 1.05rem; }
section#gpu-validate img { max-width: 100%; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table(t: Table) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return f"<table><caption>{_e(t.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(c: Chart, png_name: str | None) -> str:
    name = f' <span class="png">({_e(png_name)})</span>' if png_name else ""
    return (f'<figure id="fig-{_e(c.name)}"><img src="{data_uri(c.png)}" alt="{_e(c.alt)}" title="{_e(c.title)}">'
            f"<figcaption>{_e(c.caption)}{name}</figcaption></figure>")


def _section(s: Section, png_names: dict[str, str]) -> str:
    parts = [f'<section id="{_e(s.id)}"><h2>{_e(s.title)}</h2>']
    parts += [f"<p>{_e(p)}</p>" for p in s.paragraphs]
    parts += [_figure(c, png_names.get(c.name)) for c in s.charts]
    if s.bullets:
        parts.append("<ul>" + "".join(f"<li>{_e(b)}</li>" for b in s.bullets) + "</ul>")
    parts += [_table(t) for t in s.tables]
    parts += [f"<p>{_e(p)}</p>" for p in s.footer]
    if s.fragment:
        parts.append(s.fragment)
    parts.append("</section>")
    return "".join(parts)


def render_html(data: ReportData, png_names: dict[str, str] | None = None) -> str:
    """The whole page as one string; ``png_names`` (chart name -> file name) is shown under each chart."""
    names = png_names or {}
    cards = "".join(f'<div class="card"><div class="label">{_e(k.label)}</div><div class="value">{_e(k.value)}</div>'
                    f'<div class="detail">{_e(k.detail)}</div></div>' for k in data.key_numbers)
    nav = " ".join(f'<a href="#{_e(s.id)}">{_e(s.title)}</a>' for s in data.sections)
    notes = "".join(f"<li>{_e(n)}</li>" for n in data.notes)
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{_e(data.title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{_e(data.title)}</h1><p class=\"subtitle\">{_e(data.subtitle)}</p>"
        f"<nav>{nav}</nav>"
        f"<section id=\"key-numbers\"><div class=\"cards\">{cards}</div></section>"
        + "".join(_section(s, names) for s in data.sections)
        + (f"<ul class=\"notes\">{notes}</ul>" if notes else "")
        + "</main></body></html>\n"
    )


def png_paths(data: ReportData, html_path: Path, png_dir: Path | None = None) -> dict[str, Path]:
    """Where each chart's PNG goes: ``png_dir/<chart>.png``, or ``<stem>_<chart>.png`` next to the page."""
    html_path = Path(html_path)
    names = [c.name for c in data.charts] + [n for s in data.sections for n in s.fragment_images]
    if png_dir is not None:
        return {n: Path(png_dir) / f"{n}.png" for n in names}
    return {n: html_path.parent / f"{html_path.stem}_{n}.png" for n in names}


def write_report(data: ReportData, html_path: Path, png_dir: Path | None = None,
                 inputs: Iterable[Path] = ()) -> list[Path]:
    """Write the PNGs and the page (never over an input file); returns the paths, page last."""
    from kvsim.outputs import check_output_path, make_dir, write_bytes_atomic, write_text_atomic

    html_path = Path(html_path)
    inputs = list(inputs)
    check_output_path(html_path, inputs)
    if png_dir is not None:
        make_dir(Path(png_dir))
    paths = png_paths(data, html_path, png_dir)
    images = {c.name: c.png for c in data.charts}
    for s in data.sections:
        images.update(s.fragment_images)
    written = []
    for name, path in paths.items():
        check_output_path(path, inputs + [html_path])
        write_bytes_atomic(path, images[name])
        written.append(path)
    shown = {n: (str(p.relative_to(html_path.parent)) if p.parent == html_path.parent else str(p))
             for n, p in paths.items()}
    write_text_atomic(html_path, render_html(data, shown))
    written.append(html_path)
    return written
