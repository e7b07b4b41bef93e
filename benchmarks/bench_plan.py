"""How long building, validating, writing and reading large plans takes.

Prints CPU seconds (process time) per operation, for plans over many ranks; nothing is
asserted. Usage: ``.venv/bin/python benchmarks/bench_plan.py [--ranks 16384] [--chunks 4]``
(about 30 s at the defaults on the 2-core development machine).
"""

from __future__ import annotations

import sys
import time

from treeattn.cli.script import ArgumentParser, count, run
from treeattn.errors import InputError
from treeattn.plan import ALGORITHMS, TopologyRef, build, validate
from treeattn.plan.io import dump_plan, load_plan
from treeattn.workload import Workload


def _timed(fn):  # noqa: ANN001, ANN202 - a tiny local helper
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=count, default=16384)
    parser.add_argument("--chunks", type=count, default=4)
    parser.add_argument("--algorithms", default="binomial,kary,chain,multirail")
    args = parser.parse_args()
    names = args.algorithms.split(",")
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        raise InputError(f"--algorithms: unknown algorithm {unknown[0]!r}; choose one of {', '.join(ALGORITHMS)}")
    work = Workload.create(ranks=args.ranks, seq_len=args.ranks * 1024, batch=4, model="llama-3.1-8b")
    ref = TopologyRef("bench", "sha256:0")
    print(f"{args.ranks} ranks, {args.chunks} chunks, llama-3.1-8b B=4 ({work.rows} rows); CPU seconds")
    for name in names:
        plan, t_build = _timed(lambda name=name: build(name, work, ref, chunks=args.chunks))
        report, t_check = _timed(lambda plan=plan: validate(plan))
        ops = sum(len(p) for p in plan.programs)
        line = f"{name:>10}: {ops:>8} ops  build {t_build:6.2f}  validate {t_check:6.2f}  valid={report.valid}"
        for fmt in ("yaml", "json"):
            text, t_dump = _timed(lambda plan=plan, fmt=fmt: dump_plan(plan, fmt))
            again, t_load = _timed(lambda text=text: load_plan(text))
            assert again == plan
            line += f"  {fmt} {len(text) / 1e6:5.1f} MB dump {t_dump:5.2f} load {t_load:5.2f}"
        print(line)


if __name__ == "__main__":
    sys.exit(run(main))
