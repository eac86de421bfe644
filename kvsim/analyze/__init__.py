"""Order-free prefix-overlap statistics and cache-friendliness diagnostics (``kvsim analyze``).

``analyze(trace, options)`` returns an :class:`AnalysisReport`; ``report.to_dict()`` is the
``--json`` content and :func:`kvsim.render.analyze.render_report` prints it.
"""
from kvsim.analyze.core import AnalysisReport, analyze
from kvsim.analyze.options import AnalyzeOptions

__all__ = ["AnalysisReport", "AnalyzeOptions", "analyze"]
