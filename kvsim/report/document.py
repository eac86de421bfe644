"""The report as data: key numbers, then sections of charts, tables and text.

:mod:`kvsim.report.build` fills it; :mod:`kvsim.report.html` renders it. Strings are plain
text (escaped when rendered), except a section's ``fragment``, which is trusted HTML.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Chart:
    """One PNG with its title, caption (one sentence) and alt text."""

    name: str
    title: str
    caption: str
    png: bytes
    alt: str


@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)   # paragraphs after the charts and tables
    fragment: str | None = None          # trusted HTML (the gpu-validate section)
    fragment_images: dict[str, bytes] = field(default_factory=dict)


@dataclass
class KeyNumber:
    label: str
    value: str
    detail: str


@dataclass
class ReportData:
    """Everything on the page; ``numbers`` holds the key figures as plain values."""

    title: str
    subtitle: str
    key_numbers: list[KeyNumber]
    sections: list[Section]
    notes: list[str]
    numbers: dict[str, Any]

    @property
    def charts(self) -> list[Chart]:
        return [c for s in self.sections for c in s.charts]
