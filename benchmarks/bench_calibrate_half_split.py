"""Calibration from nccl-tests logs, checked on the published corpus: per table, lines fitted
per size band on every other size predict the sizes in between (``half_split``).

    .venv/bin/python benchmarks/bench_calibrate_half_split.py [--out FILE]

Prints, per table of results/published with at least 6 rows, the held-out rows and the
median and largest |predicted / measured - 1|, then the median over every held-out row.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from treeattn.calibrate.from_nccl_tests import SIZE_BANDS, half_split
from treeattn.cli.paths import output_file
from treeattn.cli.script import ArgumentParser, run
from treeattn.textfile import write_file
from treeattn.validate.corpus import load_corpus


def main() -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    out = output_file(args.out, "--out", "calibration-half-split.txt") if args.out else None
    bands = ", ".join(f"{lo}-{hi or 'max'} B" for lo, hi in SIZE_BANDS)
    lines = [f"size bands: {bands}; fit on rows 0, 2, 4, ...; predict rows 1, 3, 5, ...",
             f"{'table':48} {'held out':>8} {'median |err|':>13} {'max |err|':>10}"]
    every: list[float] = []
    for t in load_corpus():
        if len(t.log.rows) < 6:
            continue
        errs = [abs(e) for e in half_split(t.log, t.collective, t.ranks).errors]
        every += errs
        lines.append(f"{t.name:48} {len(errs):>8} {statistics.median(errs):>12.1%} {max(errs):>10.1%}")
    lines.append(f"{'all held-out rows':48} {len(every):>8} {statistics.median(every):>12.1%} {max(every):>10.1%}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if out:
        write_file(out, text)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
