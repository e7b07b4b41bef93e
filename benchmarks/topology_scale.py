"""How long topology building and routing take at cluster scale (prints what it measures).

Usage: .venv/bin/python benchmarks/topology_scale.py [SPEC] [PAIRS]
       (defaults: dgx-h100:nodes=2048, 100000 random rank pairs; about 5 s on the 2-core
       development machine)

Prints wall and CPU seconds per step: on a shared machine CPU time is the steadier figure.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable

from treeattn.cli.script import ArgumentParser, count, run
from treeattn.topology import domains
from treeattn.topology.families import build_family, parse_family_spec


def timed(label: str, fn: Callable[[], object], note: str = "") -> object:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    print(f"{label:<18}{wall:7.2f} s wall {cpu:7.2f} s cpu  {note}".rstrip())
    return out


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default="dgx-h100:nodes=2048", help="a family spec")
    ap.add_argument("pairs", nargs="?", type=count, default=100_000, help="random rank pairs to route")
    args = ap.parse_args()
    spec, n_pairs = args.spec, args.pairs
    name, params = parse_family_spec(spec)
    topo = timed("build", lambda: build_family(name, params))
    print(f"  {spec}: {topo.num_ranks} ranks, {len(topo.devices)} devices, {len(topo.links)} links")
    timed("check_routable", topo.check_routable, f"({2 * (topo.num_ranks - 1)} routes)")
    rng = random.Random(0)
    pairs = [(rng.randrange(topo.num_ranks), rng.randrange(topo.num_ranks)) for _ in range(n_pairs)]

    def route_all() -> None:
        for a, b in pairs:
            topo.route(a, b)

    timed("route, new pairs", route_all, f"({n_pairs} random rank pairs)")
    timed("route, cached", route_all, f"(the same {n_pairs} again)")
    timed("fingerprint", lambda: topo.fingerprint)
    levels = timed("domains", lambda: domains(topo))
    print(f"  levels: {', '.join(f'{lv.kind.value}:{len(lv.groups)} groups' for lv in levels)}")


if __name__ == "__main__":
    sys.exit(run(main))
