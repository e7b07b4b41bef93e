"""Refit the host CPU terms of a validation's saved calibrations and re-predict its measured rows.

A ``treeattn validate --calibrate`` folder keeps, per topology, every calibration case's
measured time and CPU time and the fitted terms (``meta.json``), and every validated plan's
measured time (``rows.csv``). This rebuilds each calibration's inputs from them (its plans
from the calibration options, the per-class alpha/beta, the kernels timed alone), refits the
host terms with this checkout's ``fit_host_terms``, and prints per topology:

* the recorded terms beside the refit, and every term the refit left at a bound;
* with ``--conditioning``: the sensitivity of every residual to the log of each CPU term at
  the recorded fit and at the refit (singular values, condition number, the direction the
  cases hardly see);
* median and p90 |error| of the validated rows predicted on the recorded calibration and on
  the refit, both by this checkout and for the same plans (each row's plan as this checkout
  builds it on the recorded calibration, kept where its chunk count is the one measured), so
  that the figures differ only in the host fit; and the regret per case, each calibration
  with its own pick (``-`` where it picks a plan that was not measured).

    .venv/bin/python benchmarks/refit_host.py results/validate-emu [--conditioning] [--out-dir DIR]

``--out-dir`` writes each refitted calibration as ``DIR/<topology>.yaml``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from treeattn.calibrate.apply_fit import ClassParams, FittedParams
from treeattn.calibrate.fit_host import fit_host_terms
from treeattn.calibrate.host_terms import HostTerms
from treeattn.calibrate.live import CalibrateOptions, calibration_plans
from treeattn.calibrate.plans import route_classes
from treeattn.cli.paths import output_folder
from treeattn.cli.script import ArgumentParser, run
from treeattn.cost.simulate import simulate
from treeattn.plan.baselines import baselines_for
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.report.summary import summarize
from treeattn.search.rings import ring_order
from treeattn.textfile import write_file
from treeattn.topology.io import dump_topology, load_topology
from treeattn.topology.library import resolve
from treeattn.validate.cases import default_cases
from treeattn.validate.methods import case_plans

TERMS = {"cpu": "cpu_us", "wake": "wakeup_us", "step": "step_us", "merge": "merge_factor", "coll": "coll_cpu_us",
         "start": "start_cpu_us", "kb": "cpu_us_per_kb", "attn": "attn_factor", "alaunch": "attn_launch_factor"}

HOST_TERMS = ("cpu_us", "wakeup_us", "step_us", "coll_cpu_us", "start_cpu_us", "cpu_us_per_kb")


def rebuild(meta: dict, rows: pd.DataFrame, t: dict):
    """One topology's calibration inputs: (topology, FittedParams, cases, start wake-up, host fit)."""
    cal, o = t["calibration"], meta["options"]["calibration"]
    topo = resolve(t["source"])
    mine = rows[rows.topology == t["name"]].iloc[0]
    opt = CalibrateOptions(max_bytes=o["max_bytes"], sizes=o["sizes"], repeats=o["repeats"], warmup=o["warmup"],
                           compute=o["compute"], attention_heads=(int(mine.q_heads), int(mine.kv_heads),
                                                                  int(mine.head_dim)))
    classes = route_classes(topo)
    planned = calibration_plans(topo, classes, opt)
    cases = {c["label"]: c for c in cal["cases"]}
    if set(cases) != {label for label, _, _ in planned}:
        raise SystemExit(f"{t['name']}: the calibration's cases are not the ones this checkout plans")
    h, cost = cal["host"], cal["cost"]
    # The recorded cost holds the kernels' figures times their fitted factors (none: not fitted, 1).
    params = FittedParams(
        classes=tuple(ClassParams(c.hops, k["alpha_us"], k["beta_gbps"])
                      for c, k in zip(classes, cal["classes"], strict=True)),
        launch_us=cost["launch_us"] / (h["merge_factor"] or 1.0),
        mem_eff_bw_gbps=cost["mem_efficiency"] * topo.device(topo.ranks[0]).mem_bw_gbps,
        attn_launch_us=cost["attn_launch_us"] / (h["attn_launch_factor"] or 1.0),
        attn_gbps=cost["attn_gbps"] / (h["attn_factor"] or 1.0), source="rebuilt from meta.json")
    measured = [(plan, cases[label]["measured_us"], cases[label]["measured_cpu_us"]) for label, plan, _ in planned]
    skew = statistics.median(k["skew_us"] for k in cal["classes"])
    return topo, params, measured, skew, h


def conditioning(terms: HostTerms, values: dict, label: str) -> None:
    """d residual / d log(term) by central differences of 5 %, and its singular values."""
    keys = [k for k in ("cpu", "wake", "step", "merge", "coll") if values.get(k)]
    group = terms.staged["messages"] + terms.staged["plan"]
    cols = []
    for k in keys:
        up = terms.residuals(terms.build({**values, k: values[k] * 1.05})[0], group)
        down = terms.residuals(terms.build({**values, k: values[k] / 1.05})[0], group)
        cols.append((np.array(up) - np.array(down)) / (2 * np.log(1.05)))
    j = np.stack(cols, axis=1)
    norms = np.linalg.norm(j, axis=0)
    _, s, vt = np.linalg.svd(j / np.where(norms > 0, norms, 1), full_matrices=False)
    print(f"  {label}: " + ", ".join(f"{k} {values[k]:.4g}" for k in keys))
    print("    |d residual / d log term|: " + ", ".join(f"{k} {n:.3g}" for k, n in zip(keys, norms, strict=True)))
    print(f"    singular values (columns scaled to 1): {', '.join(f'{x:.3g}' for x in s)}; "
          f"condition {s[0] / s[-1]:.3g}")
    print("    least-seen direction: " + ", ".join(f"{k} {x:+.2f}" for k, x in zip(keys, vt[-1], strict=True)))


def planned(cal, topo) -> tuple[dict, dict]:
    """{(case, method): (plan key or None for a baseline, plan)} and {case: the pick's key},
    planned on ``cal`` as ``treeattn validate`` plans."""
    out, picks = {}, {}
    ring = tuple(ring_order(topo)[1])
    for case in default_cases(topo):
        for m in case_plans(cal, case.workload, result=case.result).methods:
            out[case.name, m.method] = ((m.plan.chunks, m.plan.programs), m.plan)
            if m.is_pick:
                picks[case.name] = (m.plan.chunks, m.plan.programs)
        for b in baselines_for(case.workload, case.result, None, ring):
            out[case.name, b.name] = (None, build(b.name, case.workload, TopologyRef.of(cal), **b.kwargs))
    return out, picks


def compared(mine: pd.DataFrame, plans: dict, cals: tuple, picks: tuple) -> tuple[list[pd.DataFrame], list[str]]:
    """The rows whose plan this checkout builds as measured, predicted on each calibration
    (the same plan on both; a row is a pick where that calibration picks its plan), and
    those left out."""
    frames, keep, left = [m.copy() for m in (mine, mine)], [], []
    for i, r in mine.iterrows():
        if (r.case, r.method) not in plans:
            left.append(f"{r.case}:{r.method} (no such method now)")
            continue
        key, plan = plans[r.case, r.method]
        if key is not None and key[0] != r.chunks:
            left.append(f"{r.case}:{r.method} (planned otherwise now)")
            continue
        for frame, cal, pick in zip(frames, cals, picks, strict=True):
            frame.at[i, "predicted_us"] = simulate(plan, cal).predicted_us
            frame.at[i, "is_pick"] = key is not None and pick.get(r.case) == key
        keep.append(i)
    return [f.loc[keep] for f in frames], left


def summary(meta: dict, r: pd.DataFrame) -> str:
    s = summarize(r, meta)
    e = s["errors"]
    regrets = ", ".join(f"{c['case']} " + ("-" if c["regret"] is None else f"{c['regret']:.3f}")
                        for c in s["cases"])
    return (f"{e['all']['n']} rows, |error| median {e['all']['median']:.3f}, p90 {e['all']['p90']:.3f}; "
            f"regret per case: {regrets}")


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--conditioning", action="store_true")
    ap.add_argument("--out-dir", type=Path)
    args = ap.parse_args()
    missing = [name for name in ("meta.json", "rows.csv") if not (args.folder / name).is_file()]
    if missing:
        ap.error(f"{args.folder}: no {' or '.join(missing)} there (give a `treeattn validate --out` folder)")
    if args.out_dir:
        args.out_dir = output_folder(args.out_dir, "--out-dir")
    meta = json.loads((args.folder / "meta.json").read_text())
    rows = pd.read_csv(args.folder / "rows.csv")
    both: list[list[pd.DataFrame]] = [[], []]
    for t in meta["topologies"]:
        topo, params, measured, skew, rec = rebuild(meta, rows, t)
        old_cal = load_topology(args.folder / "calibration" / f"{t['name']}.yaml")
        new_cal, fit, _ = fit_host_terms(topo, params, measured, rec["cores"], start_wakeup_us=skew,
                                         cpu_queue=rec["cpu_queue"], name=old_cal.name)
        print(f"{t['name']}: {len(measured)} calibration cases; rms log error recorded {rec['rms_log_error']:.3f}, "
              f"refit {fit.rms_log_error:.3f}")
        for what, cost in (("recorded", old_cal.cost), ("refit", new_cal.cost)):
            terms = {**{k: getattr(cost.host, k) for k in HOST_TERMS},
                     **{k: getattr(cost, k) for k in ("launch_us", "attn_launch_us", "attn_gbps")}}
            print(f"  {what:9} " + ", ".join(f"{k} {v:.4g}" for k, v in terms.items() if v is not None))
        for flag in fit.at_bounds:
            print(f"  at a bound: {flag}")
        if args.conditioning:
            terms = HostTerms(topo, params, measured, rec["cores"], cpu_queue=rec["cpu_queue"])
            conditioning(terms, {"loop": terms.flow, **{k: rec[v] for k, v in TERMS.items() if rec.get(v)}},
                         "recorded")
            conditioning(terms, {"loop": terms.flow, **{k: v for k, n in TERMS.items()
                                                          if (v := getattr(fit, n))}}, "refit")
        if args.out_dir:
            write_file(args.out_dir / f"{t['name']}.yaml", dump_topology(new_cal))
        mine = rows[rows.topology == t["name"]]
        plans, old_picks = planned(old_cal, topo)
        (before, after), left = compared(mine, plans, (old_cal, new_cal), (old_picks, planned(new_cal, topo)[1]))
        print(f"  validated rows compared: {len(before)} of {len(mine)} (left out: {', '.join(left) or 'none'})")
        print(f"  on the recorded fit: {summary(meta, before)}")
        print(f"  on the refit:        {summary(meta, after)}")
        both[0].append(before)
        both[1].append(after)
    for what, frames in zip(("recorded fits", "refits"), both, strict=True):
        e = summarize(pd.concat(frames), meta)["errors"]["all"]
        print(f"all topologies on the {what}: {e['n']} rows, |error| median {e['median']:.3f}, p90 {e['p90']:.3f}")


if __name__ == "__main__":
    sys.exit(run(main))
