"""The HTML/PNG report (``kvsim report``, ``--html`` on analyze, simulate and sweep).

- :func:`build_report` -> :class:`ReportData`: analyze, one-pass curves and exact replays of
  one trace, as key numbers, charts (PNG bytes), tables and captions;
- :func:`write_report`: the PNG files plus one self-contained HTML page;
- :func:`make_report`: both in one call (what the commands use).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from kvsim.report.build import ReportOptions, build_report, capacity_for_share, has_capacity
from kvsim.report.document import Chart, KeyNumber, ReportData, Section, Table
from kvsim.report.html import render_html, write_report


def make_report(trace: Any, html_path: str | Path, options: ReportOptions | None = None, *,
                png_dir: str | Path | None = None, inputs: Iterable[str | Path] = (),
                analysis: dict[str, Any] | None = None, runs: dict[str, Any] | None = None,
                sweep_result: Any = None, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Build the report of ``trace`` and write it; returns the files written, the HTML page last.

    ``analysis``/``runs``/``sweep_result`` reuse what a command already computed (see
    :func:`build_report`); ``inputs`` are never written over.
    """
    from kvsim.outputs import check_output_path

    html_path = Path(html_path)
    inputs = [Path(p) for p in inputs]
    check_output_path(html_path, inputs)  # fail before the work, not after
    data = build_report(trace, options, analysis=analysis, runs=runs, sweep_result=sweep_result, progress=progress)
    return write_report(data, html_path, None if png_dir is None else Path(png_dir), inputs)


__all__ = ["ReportOptions", "ReportData", "Chart", "KeyNumber", "Section", "Table", "build_report",
           "render_html", "write_report", "make_report", "capacity_for_share", "has_capacity"]
