"""Reports built from saved simulation results (DESIGN §9, docs/REPORTS.md).

:func:`build_report` reads ``DIR/results/*.json`` — each a
:meth:`~sim.engine.result.SimResult.to_json` document, plus the optional fields a sweep
adds (``scenario``, ``sweep``: axis key → value, ``git_revision``) — and writes
``DIR/figures/*.png`` and ``DIR/summary.md``. It never looks at live objects: the same
JSON files give the same summary and byte-identical figures. :func:`check_report_output`
checks, cheaply, that a report can be written into ``DIR``: run it before the simulations.
"""

from __future__ import annotations

from sim.report.build import RESULTS_DIR, build_report, check_report_output, git_revision
from sim.report.data import ReportError, Row, load_results

__all__ = [
    "RESULTS_DIR",
    "ReportError",
    "Row",
    "build_report",
    "check_report_output",
    "git_revision",
    "load_results",
]
