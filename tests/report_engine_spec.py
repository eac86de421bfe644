"""A test engine for the report: vLLM's APC under another name, label and colour, and with no
one-pass curve and no optimum named, so the report must draw it as it draws a plugin such as
``examples/engines/lfu.py`` (dense exact replays, no optimum). Its replays are APC's, hit for
hit, which the tests use as the expected answer."""
from __future__ import annotations

from kvsim.engines.spec import EngineSpec
from kvsim.engines.vllm.spec import APCSpec


class MirrorSpec(APCSpec):
    name = "mirror"
    label = "Mirror blocks"
    short = "MIR"
    color = "#0f766e"
    curve = None
    curve_exact = False
    optimal = None
    describe = EngineSpec.describe          # "Mirror blocks (block 16)", not APC's words
