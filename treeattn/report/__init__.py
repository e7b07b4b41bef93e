"""Tables and plots of validation results (pandas and matplotlib; never torch).

``load_folder`` reads a results folder (``folder`` documents its files), ``summarize`` computes
the figures (prediction error, regret, speedups, the issue's targets), ``render_folder``
writes ``summary.json`` and the PNGs, ``tables`` builds the rich tables the CLI prints.
"""

from treeattn.report.folder import (
    META_FILE,
    ROW_COLUMNS,
    ROWS_FILE,
    SUMMARY_FILE,
    TIMELINE_COLUMNS,
    TIMELINE_FILE,
    ResultsFolder,
    load_folder,
)
from treeattn.report.render import Rendered, render_folder
from treeattn.report.summary import TARGETS, case_frame, error_frame, summarize, summary_json

__all__ = [
    "META_FILE",
    "ROWS_FILE",
    "ROW_COLUMNS",
    "SUMMARY_FILE",
    "TARGETS",
    "TIMELINE_COLUMNS",
    "TIMELINE_FILE",
    "Rendered",
    "ResultsFolder",
    "case_frame",
    "error_frame",
    "load_folder",
    "render_folder",
    "summarize",
    "summary_json",
]
