"""The report's optional GPU section: a ``kvsim gpu-validate`` result JSON, read back.

The figures and the HTML fragment are those of :mod:`kvsim.gpu.report`; this module only
rebuilds its :class:`~kvsim.gpu.validate.ValidationResult` from ``gpu_validate.json``
(no torch needed).
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvsim.errors import InputError


def load_validation(path: str | Path):
    """Read ``gpu_validate.json`` (written by ``kvsim gpu-validate``) into a ValidationResult."""
    from kvsim.gpu.calibration import SCHEMA, Calibration
    from kvsim.gpu.roofline import DevicePeak
    from kvsim.gpu.validate import RequestCheck, ValidationResult

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(path, f"not a readable gpu-validate result JSON ({e.__class__.__name__})") from None
    need = ("config", "summary", "requests")
    if not isinstance(data, dict) or any(k not in data for k in need):
        raise InputError(path, "not a kvsim gpu-validate result (expected the keys config, summary and requests; "
                               "it is the gpu_validate.json that kvsim gpu-validate writes)")
    names = {f.name for f in fields(RequestCheck)}
    try:
        checks = [RequestCheck(**{k: v for k, v in r.items() if k in names}) for r in data["requests"]]
        cal = data.get("calibration")
        calibration = None
        if isinstance(cal, dict) and cal.get("schema") == SCHEMA:
            calibration = Calibration(**{k: v for k, v in cal.items() if k != "schema"})
        peak = DevicePeak(**data["device_peak"]) if data.get("device_peak") else None
        return ValidationResult(config=data["config"], checks=checks, tolerance=float(data["summary"]["tolerance"]),
                                control=data.get("control"), calibration=calibration, peak=peak)
    except (TypeError, KeyError, ValueError) as e:
        raise InputError(path, f"malformed gpu-validate result ({e.__class__.__name__}: {e})") from None


def gpu_charts(result) -> list[tuple[str, Any]]:
    """(file stem, figure) of each gpu-validate figure that has data to show."""
    from kvsim.gpu.report import FIGURES

    out = []
    for name, make in FIGURES.items():
        try:
            fig = make(result)
        except (ValueError, ZeroDivisionError, TypeError):  # nothing measured for this figure
            continue
        out.append((Path(name).stem, fig))
    return out


def gpu_fragment(result, images: dict[str, str]) -> str:
    """The gpu-validate HTML fragment with the given ``name -> src`` images."""
    from kvsim.gpu.report import html_section

    return html_section(result, images)
