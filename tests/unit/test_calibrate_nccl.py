"""``treeattn calibrate --from-nccl-tests``: fixture logs mapped onto topologies, damaged logs refused."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
from treeattn.calibrate.from_nccl_tests import calibrate_from_nccl_tests, half_split
from treeattn.calibrate.nccl_tests import (
    calibrate_from_log,
    log_run,
    parse_nccl_tests,
    printed_version,
    read_nccl_tests,
)
from treeattn.cost import nccl, nccl_fabric, nccl_rates
from treeattn.cost.bounds import CutModel
from treeattn.cost.library import LibraryModel
from treeattn.errors import InputError, ProbeError
from treeattn.topology.io import dump_topology, load_topology, load_topology_text
from treeattn.topology.library import resolve

FIX = Path(__file__).parents[1] / "fixtures" / "nccl-tests"
ONE = FIX / "all_reduce_perf.8xh100-1node.txt"
FOUR = FIX / "all_reduce_perf.4x8xh100-ib400.txt"
DGX4 = resolve("dgx-h100:nodes=4")
GEFORCE = load_topology_text(
    "name: geforce-2x4\nnodes: 2\nnode:\n  gpus: {count: 4, model: RTX-4090, mem_bw_gbps: 1000, p2p: false}\n"
    "  pcie: {generation: 4, width: 16, bw_gbps: 25}\n  nics: {count: 1, bw_gbps: 50}\nnetwork: {kind: infiniband}\n")


def test_one_node_log_sets_the_nvlink_class():
    from treeattn.cost.nccl_rates import pair_rate_gbps

    cf = calibrate_from_log(read_nccl_tests(ONE))
    result = calibrate_from_nccl_tests(DGX4, [ONE])
    (lf,) = result.logs
    assert (lf.scope, lf.route_class) == ("node", "nvlink>nvlink")
    # One NVSwitch port carries all of a GPU's NVLink: it gets the whole bus bandwidth.
    assert lf.beta_gbps == pytest.approx(cf.beta_link_gbps)
    topo = result.topology
    assert topo.route_bw_gbps(0, 1) == pytest.approx(cf.beta_link_gbps)
    # The network is not fitted: a transfer reaches what it reached before (its links' rates
    # are now those it reached, a measured topology's being read as they are).
    assert pair_rate_gbps(topo, 0, 8) == pytest.approx(pair_rate_gbps(DGX4, 0, 8))
    # Its sizes (128 MiB-4 GiB) all lie past the size whose transfer takes as long as the fitted
    # latency (127 us a call, 9 a ring step): the latency is the line's offset, not measured,
    # and the route keeps the topology's.
    assert not cf.latency_measured and cf.size_range[0] > cf.half_bandwidth_bytes and not lf.latency_written
    assert any("extrapolated" in n for n in lf.notes) and any("kept from the topology" in n for n in lf.notes)
    assert lf.alpha_us == DGX4.cost.overhead_us + DGX4.route_latency_us(0, 1) < cf.alpha_step_us
    assert [ln.latency_us for ln in topo.links] == [ln.latency_us for ln in DGX4.links]


def test_a_log_from_small_sizes_sets_the_latency(tmp_path):
    # Together's 8 x H100 ring all-reduce (the corpus's together-h100-1node/ring table) starts
    # at 8 bytes: its latency is measured, and the class gets it.
    text = (Path(__file__).parents[2] / "results" / "published" / "together-h100-1node.txt").read_text().splitlines()
    log = tmp_path / "all_reduce_perf.ring.txt"
    log.write_text("\n".join(text[1:54]) + "\n")
    result = calibrate_from_nccl_tests(resolve("dgx-h100"), [log])
    (lf,) = result.logs
    assert lf.fit.size_range[0] == 8 and lf.latency_written and lf.alpha_us == pytest.approx(lf.fit.alpha_step_us)
    topo = result.topology
    assert topo.cost.overhead_us + topo.route_latency_us(0, 1) == pytest.approx(lf.fit.alpha_step_us)


def test_a_log_from_large_sizes_only_keeps_the_topology_latency(tmp_path):
    # xxrjun's 8 x H100 sendrecv (the corpus's xxrjun-nccl-tests-cluster/1node-g8-sendrecv
    # table) runs from 32 MiB: its line's offset, 384 µs, is the ramp to its bandwidth. Judged
    # by itself it looks measured (its half-bandwidth size, 146 MiB, holds the smallest rows);
    # at the topology's latency of a sendrecv (2.6 µs) the half-bandwidth size is under 1 MiB.
    text = (Path(__file__).parents[2] / "results" / "published" / "xxrjun-nccl-tests-cluster.txt").read_text()
    log = tmp_path / "sendrecv_perf.g8.txt"
    log.write_text("\n".join(text.splitlines()[142:172]) + "\n")
    result = calibrate_from_nccl_tests(resolve("dgx-h100"), [log])
    (lf,) = result.logs
    assert lf.fit.size_range[0] == 32 << 20 and lf.fit.latency_measured and lf.fit.fit.alpha_us > 300
    assert not lf.latency_written and any("not measured" in n for n in lf.notes)
    assert lf.alpha_us == pytest.approx(2.6)
    assert [ln.latency_us for ln in result.topology.links] == [ln.latency_us for ln in resolve("dgx-h100").links]


def test_a_multi_node_log_from_large_sizes_only_keeps_the_network_latency(tmp_path):
    # voltagepark's 4 x 8 H100 broadcast (the corpus's voltagepark-h100-4node/broadcast table)
    # cut to its rows from 32 MiB: its line's offset, 204 µs, would write a 44 µs network
    # latency. The topology's latency for the broadcast is 3 network steps and 28 NVLink ones
    # (88 µs; its half-bandwidth size under the smallest size), not 31 network steps (161 µs).
    published = Path(__file__).parents[2] / "results" / "published"
    lines = (published / "voltagepark-h100-4node.txt").read_text().splitlines()
    rows = [ln.split() for ln in lines[:82] if ln.split() and ln.split()[0].isdigit()]
    kept = [r for r in rows if int(r[0]) >= 32 << 20]
    bus = [float(x) for r in kept for x in (r[-6], r[-2])]
    text = [re.sub(r"minBytes \d+", f"minBytes {32 << 20}", ln) if "minBytes" in ln
            else f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4f}" if "Avg bus bandwidth" in ln else ln
            for ln in lines[:82] if not (ln.split() and ln.split()[0].isdigit() and int(ln.split()[0]) < 32 << 20)]
    log = tmp_path / "broadcast_perf.txt"
    log.write_text("\n".join(text) + "\n")
    result = calibrate_from_nccl_tests(DGX4, [log])
    (lf,) = result.logs
    assert lf.scope == "network" and lf.fit.latency_measured and lf.fit.fit.alpha_us > 150
    assert not lf.latency_written and any("not measured" in n and "(88.4 µs a call" in n for n in lf.notes)
    assert [ln.latency_us for ln in result.topology.links] == [ln.latency_us for ln in DGX4.links]


def test_multi_node_log_sets_one_rail_link_from_the_node_egress():
    cf = calibrate_from_log(read_nccl_tests(FOUR))
    result = calibrate_from_nccl_tests(DGX4, [ONE, FOUR])
    by_scope = {lf.scope: lf for lf in result.logs}
    net = by_scope["network"]
    assert net.route_class.startswith("pcie>pcie>infiniband")
    # 8 NICs of 50 GB/s per node carry the bus bandwidth: one rail link gets an eighth of it.
    assert net.beta_gbps == pytest.approx(cf.beta_link_gbps / 8)
    assert result.topology.route_bw_gbps(0, 8) == pytest.approx(cf.beta_link_gbps / 8)
    # The ring's latency is mostly NVLink steps: what is left for the network is negative, so
    # the route latency is 0 and the log says why.
    assert any("below the overhead" in n for n in net.notes)
    assert by_scope["node"].beta_gbps == pytest.approx(calibrate_from_log(read_nccl_tests(ONE)).beta_link_gbps)


def test_a_multi_node_sendrecv_log_sets_the_rail_link_to_what_one_stream_got(tmp_path):
    # xxrjun's 2 x 8 H100 sendrecv (4-16 GiB, 45.87 GB/s): the one stream that leaves a node
    # crosses one NIC. Spread over the node's 8 NICs as a collective's rings are, the rail links
    # got 5.7 GB/s, and check-model on the calibrated file gave +700 % on the same log.
    corpus = Path(__file__).resolve().parents[2] / "results" / "published"
    log = tmp_path / "sendrecv_perf.txt"
    log.write_text("\n".join((corpus / "xxrjun-nccl-tests-cluster.txt").read_text().splitlines()[652:683]) + "\n")
    cf = calibrate_from_log(read_nccl_tests(log))
    result = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [log])
    (net,) = result.logs
    assert net.scope == "network" and net.beta_gbps == pytest.approx(cf.beta_link_gbps)
    assert result.topology.route_bw_gbps(0, 8) == pytest.approx(cf.beta_link_gbps)
    _scores_its_own_log_within(result.topology, log, 0.01, tmp_path)


def _scores_its_own_log_within(topo, log: Path, tolerance: float, tmp_path: Path) -> None:
    """check-model on the calibrated topology predicts the log it was fitted from within ``tolerance``."""
    out = tmp_path / "cal.yaml"
    out.write_text(dump_topology(topo))
    res = run_cli("check-model", str(log), "-t", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    assert all(abs(r["error"]) < tolerance for r in json.loads(res.stdout)["rows"]), res.stdout


def test_nccls_collective_model_reads_the_hardware_ratings_a_calibration_keeps(tmp_path):
    # The ring fit gives the rail links 39 GB/s, which is right for treeattn's own sends and
    # wrong for NCCL's trees and protocols, which read a link as NCCL rates the hardware
    # (50 GB/s ports): the calibrated topology keeps the ratings, and NCCL's model reads them.
    result = calibrate_from_nccl_tests(DGX4, [ONE, FOUR])
    out = tmp_path / "cal.yaml"
    out.write_text(dump_topology(result.topology))
    topo = load_topology(out)
    assert topo.fingerprint == result.topology.fingerprint
    assert topo.route_bw_gbps(0, 8) == pytest.approx(calibrate_from_log(read_nccl_tests(FOUR)).beta_link_gbps / 8)
    # ... at the NCCL release the log printed, which the calibrated topology names
    same = dataclasses.replace(DGX4, cost=dataclasses.replace(DGX4.cost, nccl_version="2.26.2"))
    assert nccl_fabric.fabric(topo) == nccl_fabric.fabric(same)
    assert nccl.pick(topo, "all_reduce", 1 << 30) == nccl.pick(same, "all_reduce", 1 << 30)
    rated = topo.rated
    assert rated.cost.link_rates == "datasheet" and rated.route_bw_gbps(0, 8) == DGX4.route_bw_gbps(0, 8)
    assert rated.route_latency_us(0, 8) == DGX4.route_latency_us(0, 8)
    # Calibrated again, a link keeps the first rating (the hardware's), not the first fit.
    again = calibrate_from_nccl_tests(topo, [FOUR]).topology
    assert nccl_fabric.fabric(again) == nccl_fabric.fabric(same)
    # ... is named once (not dgx-h100-nodes4-calibrated-calibrated), and the same logs again
    # are listed once.
    assert again.name == topo.name == "dgx-h100-nodes4-calibrated"
    assert calibrate_from_nccl_tests(topo, [ONE, FOUR]).topology.sources == topo.sources
    assert DGX4.rated is DGX4  # nothing measured: the topology itself
    # The floor under NCCL's collectives is the hardware's too: a cut at the fitted 39 GB/s
    # would put a 1 GiB all-reduce's floor 27 % above the hardware's.
    floor = LibraryModel(topo).cuts.collective_floor_us(1 << 30, 1 << 20, everyone=True)
    assert floor == LibraryModel(DGX4).cuts.collective_floor_us(1 << 30, 1 << 20, everyone=True)
    assert CutModel(topo).collective_floor_us(1 << 30, 1 << 20, everyone=True) > 1.2 * floor


def test_a_shared_memory_log_leaves_the_routes_to_other_nodes_alone(tmp_path):
    # The same 2-GPU log on two nodes of 4 GeForce GPUs: the cross-node route keeps its PCIe
    # links (calibration had set every 25 GB/s PCIe link to the host's 3.6 GB/s), and with
    # the network measured too, the two GPUs' transfers keep the host's rate.
    text = (Path(__file__).parents[2] / "results" / "published" / "kalavai-rtx4090.txt").read_text().splitlines()
    log = tmp_path / "all_reduce_perf.k8s-2gpu.txt"
    log.write_text("\n".join(text[147:187]) + "\n")
    result = calibrate_from_nccl_tests(GEFORCE, [log])
    assert result.topology.route_bw_gbps(0, 4) == GEFORCE.route_bw_gbps(0, 4)
    net = ClassParams(tuple((ln.kind.value, ln.bw_gbps) for ln in GEFORCE.route_links(0, 4)), 10.0, 20.0)
    both, _ = apply_fit(result.topology, FittedParams((net,), landed_by_copy=False))
    assert both.cost.link_rates == "measured"
    assert nccl_rates.shm_pair_gbps(both, 0, 1) == nccl_fabric.fabric(both).shm_gbps == result.topology.cost.shm_gbps


def test_a_calibration_of_other_routes_leaves_the_shared_memory_rate_alone():
    # Two nodes of 4 GeForce GPUs: a fit of the network class changes PCIe links the
    # shared-memory pairs' routes share (calibration changes links by kind and rate), but
    # measured no such pair: NCCL's model keeps SHM_GBPS for them.
    geforce = GEFORCE
    net = ClassParams(tuple((ln.kind.value, ln.bw_gbps) for ln in geforce.route_links(0, 4)), 10.0, 20.0)
    fitted, _ = apply_fit(geforce, FittedParams((net,), landed_by_copy=False))
    assert any(ln.rated_gbps is not None for ln in fitted.route_links(0, 1))
    assert nccl_fabric.fabric(fitted).shm_gbps == nccl_fabric.fabric(geforce).shm_gbps == nccl_rates.SHM_GBPS


def test_a_topology_measured_without_ratings_gets_none_invented():
    # A calibrated file from before ratings were kept: its rates are measured, and the
    # hardware's are unknown. Calibrated again, it gets no ratings (its fitted rates are none).
    cal = calibrate_from_nccl_tests(DGX4, [FOUR]).topology
    bare = dataclasses.replace(cal, links=tuple(dataclasses.replace(ln, rated_gbps=None, rated_latency_us=None)
                                                for ln in cal.links))
    again = calibrate_from_nccl_tests(bare, [FOUR])
    assert all(ln.rated_gbps is None and ln.rated_latency_us is None for ln in again.topology.links)
    assert again.topology.rated is again.topology
    assert any("without keeping its links' hardware ratings" in w for w in again.warnings)


def test_a_calibrated_shared_memory_hop_keeps_its_measured_rate(tmp_path):
    # GeForce cards have no peer-to-peer: NCCL copies through host memory at a rate the host
    # sets (nccl_rates.SHM_GBPS when unknown). Calibrated from kalavai's 2 x RTX 4090 log (the
    # corpus's k8s-2gpu table), NCCL's model takes the measured rate for that hop, and the
    # hardware's ratings for everything else.
    text = (Path(__file__).parents[2] / "results" / "published" / "kalavai-rtx4090.txt").read_text().splitlines()
    log = tmp_path / "all_reduce_perf.k8s-2gpu.txt"
    log.write_text("\n".join(text[147:187]) + "\n")
    family = resolve("rtx4090:gpus=2")
    result = calibrate_from_nccl_tests(family, [log])
    (lf,) = result.logs
    fab = nccl_fabric.fabric(result.topology)
    assert nccl_fabric.fabric(family).shm_gbps == nccl_rates.SHM_GBPS
    assert fab.shm_gbps == pytest.approx(lf.beta_gbps) != pytest.approx(nccl_rates.SHM_GBPS, rel=0.1)
    assert dataclasses.replace(fab, shm_gbps=nccl_rates.SHM_GBPS) == nccl_fabric.fabric(family)
    assert result.topology.cost.shm_gbps == pytest.approx(lf.fit.beta_link_gbps)
    # The rate is the host's, not the links': they keep their figures (calibration changes
    # links by kind and rate, so the PCIe links to the NICs would have moved too), and the
    # simulator's transfers between the two GPUs move at it.
    assert lf.shm and result.topology.links == family.links and result.topology.cost.link_rates == "datasheet"
    assert nccl_rates.shm_pair_gbps(result.topology, 0, 1) == pytest.approx(lf.fit.beta_link_gbps)
    # Written by hand (a tuned host), it reaches NCCL's model and the simulator's pairs alike,
    # and survives the YAML.
    hand = dataclasses.replace(family, cost=dataclasses.replace(family.cost, shm_gbps=12.5))
    back = load_topology_text(dump_topology(hand))
    assert back.fingerprint == hand.fingerprint != family.fingerprint
    assert nccl_fabric.fabric(back).shm_gbps == nccl_rates.shm_pair_gbps(back, 0, 1) == 12.5


def test_mi300x_bus_bandwidth_is_spread_over_seven_links(tmp_path):
    # The 1-node log again, read as if it came from an 8 x MI300X node: xGMI full mesh, so
    # each of a GPU's seven links carries a seventh.
    as_mi300x = tmp_path / ONE.name  # its device lines renamed: a log's GPUs must be the topology's
    as_mi300x.write_text(ONE.read_text().replace("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"))
    cf = calibrate_from_log(read_nccl_tests(as_mi300x))
    (lf,) = calibrate_from_nccl_tests(resolve("mi300x"), [as_mi300x]).logs
    assert lf.route_class == "xgmi" and lf.beta_gbps == pytest.approx(cf.beta_link_gbps / 7)


def test_logs_need_enough_ranks_and_intact_files():
    with pytest.raises(InputError, match="ran on 32 ranks but topology"):
        calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [FOUR])
    with pytest.raises(ProbeError, match="ends inside the table"):
        calibrate_from_nccl_tests(DGX4, [FIX / "damaged" / "all_reduce_perf.truncated.txt"])
    # --partial: fitted on the whole rows, with a warning that says so
    cut = calibrate_from_nccl_tests(DGX4, [FIX / "damaged" / "all_reduce_perf.truncated.txt"], partial=True)
    assert cut.logs[0].fit.size_range[1] == 1 << 30
    assert any("after 28 whole rows up to 1 GiB: fitted on those rows (--partial)" in w for w in cut.warnings)
    with pytest.raises(InputError, match="at least one log"):
        calibrate_from_nccl_tests(DGX4, [])


# -- CLI ---------------------------------------------------------------------------------------------


def test_cli_writes_a_topology_that_loads_back(tmp_path):
    out = tmp_path / "dgx4.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), str(FOUR), "-t", "dgx-h100:nodes=4", "-o", str(out),
                  "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert [lf["scope"] for lf in data["logs"]] == ["node", "network"]
    topo = load_topology(out)
    assert topo.fingerprint == data["fingerprint"] and data["out"] == str(out)
    assert topo.route_bw_gbps(0, 1) == pytest.approx(data["logs"][0]["class_beta_gbps"])
    # without --out the fit is shown and said to be kept nowhere
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 0 and "nothing written: --out FILE keeps the fitted topology" in res.stdout
    assert json.loads(run_cli("calibrate", "--from-nccl-tests", str(ONE), "-t", "dgx-h100:nodes=4",
                              "--json").stdout)["out"] is None


def test_cli_table_and_repeated_flag():
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), "--from-nccl-tests", str(FOUR), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 0, res.stderr
    assert "nccl-tests fits" in res.stdout and "below the overhead" in res.stderr
    # the bus bandwidth column is the fitted line's, and the legend says so (the log's own
    # largest busbw on the 4-node log is 366 GB/s; the line's, 314)
    assert "fit bus GB/s: the bus bandwidth of the line fitted to the log's times" in res.stdout
    for path in (ONE, FOUR):
        cells = re.sub(" +", " ", res.stdout)  # however wide the columns came out
        assert f"│ {calibrate_from_log(read_nccl_tests(path)).beta_link_gbps:.4g} │" in cells


def test_every_part_of_the_fit_table_names_its_log_at_80_columns(monkeypatch):
    # A multi-node log's route class (network: pcie>pcie>infiniband>infiniband>pcie>pcie) was one
    # unbreakable word: at 80 columns the table was split with the log column left out of the
    # part holding the class and the fitted rates, whose rows then named no log.
    monkeypatch.setenv("COLUMNS", "80")
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), str(FOUR), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 0, res.stderr
    parts = res.stdout.split("nccl-tests fits mapped onto")[1:]
    assert len(parts) > 1 and all(FOUR.name in p and ONE.name in p for p in parts), res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--from-nccl-tests", str(FIX / "damaged" / "all_reduce_perf.row-missing.txt"), "-t", "dgx-h100:nodes=4"],
         "all_reduce_perf.row-missing.txt:"),
        (["--from-nccl-tests", str(FIX / "damaged" / "all_reduce_perf.truncated.txt"), "-t", "dgx-h100:nodes=4"],
         "truncated?"),
        # a damaged log is named by the path given (two folders may hold logs of one name)
        (["--from-nccl-tests", str(FIX / "damaged" / "all_reduce_perf.truncated.txt"), "-t", "dgx-h100:nodes=4"],
         f"error: {FIX / 'damaged' / 'all_reduce_perf.truncated.txt'}:"),
        (["--from-nccl-tests", str(ONE)], "needs --topology"),
        (["--from-nccl-tests", str(ONE), "-t", str(FOUR)], "an nccl-tests log, not a topology"),
        ([str(ONE)], "go after --from-nccl-tests"),
        (["--from-nccl-tests", str(FIX / "missing.txt"), "-t", "dgx-h100:nodes=4"], "cannot read nccl-tests file"),
        # H100s' rates are not written into an A100 topology's links
        (["--from-nccl-tests", str(ONE), "-t", "dgx-a100"], "the log ran on NVIDIA H100 80GB HBM3, not dgx-a100's"),
        # the plot is of live measurements: asked for with logs, it is refused rather than never drawn
        (["--from-nccl-tests", str(FOUR), "-t", "dgx-h100:nodes=4", "--png", "never.png"], "check-model"),
        # a live calibration's options, given with logs, would go unused: said, not ignored
        (["--from-nccl-tests", str(FOUR), "-t", "dgx-h100:nodes=4", "--repeats", "5", "--no-contention"],
         "--repeats, --contention/--no-contention: options of a live calibration; --from-nccl-tests fits"),
    ],
)
def test_cli_refuses_with_one_line(args, match):
    res = run_cli("calibrate", *args)
    assert res.exit_code == 2
    assert match in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_reads_what_nccl_tests_2_19_prints_on_request(tmp_path):
    # -S 1 (timestamps) and -J (JSON; here of -I 1) logs, written to nccl-tests 2.19.6's formats.
    stamped = FIX / "all_reduce_perf.8xh100-S1.txt"
    res = run_cli("calibrate", "--from-nccl-tests", str(stamped), "-t", "dgx-h100", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["logs"][0]["beta_link_gbps"] == pytest.approx(
        calibrate_from_log(read_nccl_tests(stamped)).beta_link_gbps)
    res = run_cli("calibrate", "--from-nccl-tests", str(FIX / "run.2x8xh100-I1.json"), "-t", "dgx-h100:nodes=2",
                  "--json")
    assert res.exit_code == 0, res.stderr
    (lf,) = json.loads(res.stdout)["logs"]
    assert (lf["collective"], lf["ranks"], lf["scope"]) == ("all_reduce", 16, "network")
    # CPU times (-C 1), and JSON that is not nccl-tests', are refused in one line.
    foreign = tmp_path / "results.json"
    foreign.write_text('{"name": "something else"}')
    for path, said in ((FIX / "all_reduce_perf.8xh100-C1.txt", "rerun without -C 1"),
                       (foreign, f"{foreign}: JSON, but not nccl-tests' -J output")):
        res = run_cli("calibrate", "--from-nccl-tests", str(path), "-t", "dgx-h100")
        assert res.exit_code == 2 and said in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["-t", "cpu:ranks=2", "--round-trips", "1,x"], "--round-trips '1,x'"),
        (["-t", "cpu:ranks=2", "--round-trips", "0"], "--round-trips '0': item 1 (0) must be at least 1"),
        (["-t", "cpu:ranks=2", "--round-trips", "1,,4"], "--round-trips '1,,4': item 2 is empty"),  # not 1,4
        (["-t", "cpu:ranks=2", "--round-trips", "1_6"], "item 1 ('1_6') is not an integer"),  # not 16
        (["-t", "cpu:ranks=2", "--round-trips", "4,4"], "--round-trips '4,4' names 4 twice"),
        (["-t", "cpu:ranks=2", "--min-size", "lots"], "cannot read --min-size 'lots'"),
        (["-t", "cpu:ranks=2", "--max-size", "-1"], "--max-size must be >= 0, got '-1'"),
        (["-t", "cpu:ranks=2", "--min-size", "1MiB", "--max-size", "4KiB"], "min <= max"),
        (["-t", "cpu:ranks=1"], "calibration needs at least 2"),
        (["-t", "no-such-machine"], "unknown topology"),
        (["-t", "cpu:ranks=2", "--compute", "fft"], "fft"),
        (["-t", "cpu:ranks=2", "--attention-shape", "8-1-32"], "--attention-shape '8-1-32'"),
        (["-t", "cpu:ranks=2", "--attention-shape", "8/3/32"], "HKV must divide HQ"),
        (["-t", "cpu:ranks=2", "--max-size", "16KiB", "--sizes", "2"], "--sizes 2: 1 of the merge kernel's sizes"),
        (["-t", "cpu:ranks=2", "--compute", "attention", "--attention-shape", "32/32/512", "--sizes", "3"],
         "1 of the attention kernel's sizes hold an attention token"),
    ],
)
def test_live_calibration_refuses_bad_flags_before_launching(args, match, monkeypatch):
    import treeattn.calibrate.live as calibrate_mod

    def no_measuring(*a, **k):
        raise AssertionError("measured before the flags were checked")

    monkeypatch.setattr(calibrate_mod, "launch", no_measuring)
    res = run_cli("calibrate", *args)
    assert res.exit_code == 2 and match in res.stderr and "Traceback" not in res.stderr


def test_half_split_predicts_the_sizes_in_between():
    # 4 nodes x 8 H100, 8 B - 16 GiB: NCCL moves from LL to LL128/trees to Simple rings, which one
    # line cannot follow; a line per size band fitted on even rows predicts the odd rows.
    log = read_nccl_tests(FIX / "all_reduce_perf.4x8xh100-ib400.txt")
    split = half_split(log)
    assert len(split.held_out) == len(log.rows) // 2 and len(split.bands) == 3
    errs = sorted(abs(e) for e in split.errors)
    assert errs[len(errs) // 2] < 0.10
    # every held-out size was predicted by its own band's line, not the training rows it interpolates
    assert all(size not in {r.size_bytes for r in log.rows[0::2]} for size, _, _ in split.held_out)
    one_line = calibrate_from_log(log.__class__(**{**log.__dict__, "rows": log.rows[0::2]}))
    worse = sorted(abs(one_line.fit.predict_us(s) / m - 1) for s, m, _ in split.held_out)
    assert worse[len(worse) // 2] > errs[len(errs) // 2]
    with pytest.raises(ProbeError, match="at least 4"):
        half_split(log.__class__(**{**log.__dict__, "rows": log.rows[:3]}))


def test_fitted_terms_are_printed_with_their_values():
    from treeattn.cli.calibrate import fitted_terms
    from treeattn.topology.model import CostParams

    cost = CostParams(attn_launch_us=41.25, attn_gbps=3.5, launch_us=2.5)
    assert fitted_terms(cost, "attn_launch_us", "attn_gbps", "attn_next_launch_us") == \
        "attn_launch_us 41.25, attn_gbps 3.5"
    assert fitted_terms(cost, "launch_us", "mem_efficiency") == "launch_us 2.5, mem_efficiency 0.8"


def test_the_collective_comes_from_the_line_newer_nccl_tests_print_first():
    text = ONE.read_text()
    assert parse_nccl_tests(text, "run.txt").collective is None
    log = parse_nccl_tests("# Collective test starting: all_reduce_perf\n" + text, "run.txt")
    assert log.collective == "all_reduce" and log_run(log)[:2] == ("all_reduce", 8)
    # The tool's own line comes before the file name a user gave; busbw/algbw then checks it.
    wrong = parse_nccl_tests("# Collective test starting: all_gather_perf\n" + text, "all_reduce_perf.txt")
    assert wrong.collective == "all_gather"
    with pytest.raises(ProbeError, match="all_gather over 8 ranks gives 0.8750"):
        log_run(wrong)


def test_links_a_log_does_not_fit_keep_the_rate_a_transfer_reached_on_them(tmp_path):
    # A network log fits the InfiniBand ports; a measured topology's rates are read as they are,
    # so the NVLink links it never measured must not jump from NCCL's 370.8 to the datasheet 450.
    from treeattn.cost.nccl_rates import transfer_gbps

    out = tmp_path / "cal.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(FOUR), "-t", "dgx-h100:nodes=4", "--out", str(out))
    assert res.exit_code == 0, res.stderr
    cal = resolve(str(out))
    assert cal.cost.link_rates == "measured"
    before = dict(zip(((ln.src, ln.dst) for ln in DGX4.links), transfer_gbps(DGX4), strict=True))
    fitted = {ln.kind.value for ln, r in zip(cal.links, transfer_gbps(cal), strict=True)
              if abs(r - before[(ln.src, ln.dst)]) > 1e-9}
    assert fitted == {"infiniband"}
    nvlink = next(ln for ln in cal.links if ln.kind.value == "nvlink")
    assert nvlink.bw_gbps == pytest.approx(370.8) and nvlink.rated_gbps == 450  # NCCL's model reads the rating


def test_nccls_channels_cap_sends_over_links_no_log_fitted(tmp_path):
    # A network log fits the InfiniBand ports, marked fitted: a send across nodes is not capped
    # again by NCCL's channels (its fitted rate has them in it), while one over NVLink is capped
    # as at datasheet rates, so ring attention on one node's ranks (128 MiB sends) is as fast
    # as on the datasheet topology.
    from treeattn.api import build_plan
    from treeattn.cost.nccl_p2p import WORLD, p2p_message_gbps, router

    out = tmp_path / "cal.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(FOUR), "-t", "dgx-h100:nodes=4", "--out", str(out))
    assert res.exit_code == 0, res.stderr
    cal = resolve(str(out))
    assert {cal.links[i].kind.value for i in cal.fitted_links} == {"infiniband"}
    for comm in ("pair", WORLD):
        assert p2p_message_gbps(cal, 0, 1, 128 << 20, comm) == p2p_message_gbps(DGX4, 0, 1, 128 << 20, comm) < 370
        assert p2p_message_gbps(cal, 0, 8, 128 << 20, comm) == math.inf > p2p_message_gbps(DGX4, 0, 8, 128 << 20, comm)
    # NCCL's PXN routes a send to another node in a communicator of every rank, whatever the rates
    assert router(cal, WORLD)(1, 8) == router(DGX4, WORLD)(1, 8) != cal.route(1, 8)
    ring = [build_plan(f"{t}[ranks 0-7]", "llama-3.1-70b", "ring-attention", batch=8, seq_len="32K",
                       mem_fraction=0.75).predicted_us
            for t in ("dgx-h100:nodes=4", out)]
    assert ring[0] == ring[1]
    # A file written before the mark (no link marked) had every rate fitted: nothing is capped.
    legacy = resolve(str(out)).to_dict()
    for ln in legacy["links"]:
        ln.pop("fitted", None)
    old = tmp_path / "old.yaml"
    old.write_text(dump_topology(load_topology_text(json.dumps(legacy))))
    assert p2p_message_gbps(resolve(str(old)), 0, 1, 128 << 20) == math.inf
    # and calibrated again, it does not know which were: every link stays fitted
    again = tmp_path / "again.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(FOUR), "-t", str(old), "--out", str(again))
    assert res.exit_code == 0, res.stderr
    assert resolve(str(again)).fitted_links == frozenset(range(len(DGX4.links)))
    # Both logs: every rank's sends cross a fitted link, and none is capped.
    both = calibrate_from_nccl_tests(DGX4, [ONE, FOUR]).topology
    assert p2p_message_gbps(both, 0, 1, 128 << 20) == p2p_message_gbps(both, 0, 8, 128 << 20) == math.inf


def test_gpus_without_peer_to_peer_keep_nccls_shared_memory_cap_once_rates_are_measured():
    from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
    from treeattn.cost.nccl_rates import SHM_GBPS, shm_pair_gbps
    from treeattn.topology.io import load_topology_text

    box = load_topology_text("name: box\nnode:\n  gpus: {count: 4, model: RTX-4090, mem_bw_gbps: 1000, mem_gb: 24, "
                             "p2p: false}\n  pcie: {generation: 4, bw_gbps: 25, latency_us: 0.5}\n")
    pcie = next(ln for ln in box.links if ln.kind.value == "pcie")
    fit = FittedParams((ClassParams((("pcie", pcie.bw_gbps),), 10.0, 20.0),), landed_by_copy=False)
    cal, _ = apply_fit(box, fit)
    assert cal.cost.link_rates == "measured" and cal.cost.shm_gbps == SHM_GBPS
    assert shm_pair_gbps(cal, 0, 1) == shm_pair_gbps(box, 0, 1)


def test_the_nccl_release_a_log_printed_is_the_calibrated_topologys(tmp_path):
    # The 4-node log prints NCCL 2.26.2: plan and nccl-model then model the NCCL check-model scores it on.
    result = calibrate_from_nccl_tests(DGX4, [FOUR])
    assert result.topology.cost.nccl_version == "2.26.2"
    both = calibrate_from_nccl_tests(DGX4, [ONE, FOUR])  # the 1-node log prints none: said, not assumed silently
    assert both.topology.cost.nccl_version == "2.26.2"
    assert any("1 of the logs print no NCCL version: taken as the others' (2.26.2)" in w for w in both.warnings)
    assert calibrate_from_nccl_tests(resolve("dgx-h100"), [ONE]).topology.cost.nccl_version is None  # prints none
    named = dataclasses.replace(DGX4, cost=dataclasses.replace(DGX4.cost, nccl_version="2.27.3"))
    kept = calibrate_from_nccl_tests(named, [FOUR])
    assert kept.topology.cost.nccl_version == "2.27.3"
    assert any("ran on NCCL 2.26.2; the topology's cost.nccl_version 2.27.3 is kept" in w for w in kept.warnings)
    old = tmp_path / FOUR.name
    old.write_text(FOUR.read_text().replace("NCCL version 2.26.2", "NCCL version 2.18.1"))
    older = calibrate_from_nccl_tests(DGX4, [old])
    assert older.topology.cost.nccl_version is None and any("2.18.1" in w for w in older.warnings)
    old.write_text(FOUR.read_text().replace("NCCL version 2.26.2", "NCCL version 2.31.1"))
    newer = calibrate_from_nccl_tests(DGX4, [old])
    assert newer.topology.cost.nccl_version == "2.31.1"
    assert ("NCCL 2.31.1 is newer than the releases the model follows (2.19-2.30.7): timed by 2.30.7's figures"
            in newer.warnings)


def test_a_release_given_for_logs_that_print_none_is_the_calibrated_topologys(tmp_path):
    # --nccl-version: the 1-node log prints no release; one that prints one must agree with it.
    got = calibrate_from_nccl_tests(resolve("dgx-h100"), [ONE], version="<2.24")
    assert got.topology.cost.nccl_version == "<2.24" and not any("print no NCCL version" in w for w in got.warnings)
    assert calibrate_from_nccl_tests(DGX4, [ONE, FOUR], version="2.26").topology.cost.nccl_version == "2.26.2"
    with pytest.raises(InputError, match=r"^--nccl-version 2\.25\.1: .*prints NCCL 2\.26\.2$"):
        calibrate_from_nccl_tests(DGX4, [FOUR], version="2.25.1")
    with pytest.raises(InputError, match="^--nccl-version: version 'two'"):
        calibrate_from_nccl_tests(DGX4, [FOUR], version="two")
    out = tmp_path / "c.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), "-t", "dgx-h100", "--nccl-version", "2.21.5", "-o",
                  str(out))
    assert res.exit_code == 0, res.stderr
    assert load_topology(out).cost.nccl_version == "2.21.5"
    res = run_cli("calibrate", "-t", "dgx-h100", "--nccl-version", "2.21.5")
    assert res.exit_code == 2 and "--nccl-version names what nccl-tests logs ran with" in res.stderr


# -- a log from another machine's layout ----------------------------------------------------------

H100_4X2 = load_topology_text(
    "name: h100-4x2\nnodes: 2\nnode:\n  gpus: {count: 4, model: H100-SXM5-80GB, mem_bw_gbps: 3350}\n"
    "  pcie: {generation: 5, bw_gbps: 55}\n  fabric: {kind: nvswitch, bw_gbps: 450}\n"
    "  nics: {count: 4, bw_gbps: 50}\nnetwork: {kind: infiniband, topology: rail-optimized}\n")


def _hosts(tmp_path, hosts):
    """The 1-node log with its ``#  Rank`` lines moved to ``hosts[rank]``."""
    lines = ONE.read_text().splitlines()
    out = [ln.replace("on    node005 ", f"on {hosts[int(ln.split()[2])]:>10} ") if ln.startswith("#  Rank") else ln
           for ln in lines]
    path = tmp_path / ONE.name
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_one_node_log_is_not_fitted_onto_two_nodes():
    # Its 8 ranks ran on node005 alone (NVLink SHARP, 474 GB/s of bus bandwidth); on a topology
    # of 4 GPUs a node they would span two nodes, and the network class would get NVLink's rate.
    with pytest.raises(InputError, match=r"ran its 8 ranks on 1 host\(s\) \(node005\), but 'h100-4x2' places "
                                         r"ranks 0-7 on 2 node\(s\)"):
        calibrate_from_nccl_tests(H100_4X2, [ONE])


def test_the_log_hosts_must_group_ranks_as_the_topology_nodes(tmp_path):
    # two hosts of 4 ranks each: the layout of h100-4x2, fitted as its network class
    (lf,) = calibrate_from_nccl_tests(H100_4X2, [_hosts(tmp_path, ["a"] * 4 + ["b"] * 4)]).logs
    assert lf.scope == "network"
    # the same two hosts dealt round-robin (mpirun --map-by node): ranks 0 and 1 on different hosts
    with pytest.raises(InputError, match="ran ranks 0 and 1 on different hosts, but 'h100-4x2' places them on "
                                         "one node"):
        calibrate_from_nccl_tests(H100_4X2, [_hosts(tmp_path, ["a", "b"] * 4)])
    # two hosts onto one node of 8: the selection that puts them on two nodes is named
    with pytest.raises(InputError, match=r"on 2 host\(s\) \(a, b\), but 'dgx-h100:nodes=4' places ranks 0-7 on 1 "
                                         r"node\(s\); give the topology it ran on \(e.g. 'dgx-h100:nodes=4\[ranks "
                                         r"0-3,8-11\]'\)"):
        calibrate_from_nccl_tests(DGX4, [_hosts(tmp_path, ["a"] * 4 + ["b"] * 4)])
    # more hosts than the topology has nodes: the family on as many nodes, where it is one
    two = _hosts(tmp_path, ["a"] * 4 + ["b"] * 4)
    with pytest.raises(InputError, match=r"\(e.g. 'dgx-h100:nodes=2\[ranks 0-3,8-11\]'\)"):
        calibrate_from_nccl_tests(resolve("dgx-h100"), [two], "dgx-h100")
    with pytest.raises(InputError, match=r"\(e.g. 'dgx-h100:fabric=fat-tree,nodes=2\[ranks 0-3,8-11\]'\)"):
        calibrate_from_nccl_tests(resolve("dgx-h100:fabric=fat-tree"), [two], "dgx-h100:fabric=fat-tree")
    with pytest.raises(InputError, match=r"give the topology it ran on$"):  # a file of its own: no family
        calibrate_from_nccl_tests(H100_4X2, [_hosts(tmp_path, ["a", "b", "c", "d"] * 2)], "h100-4x2.yaml")
    # dealt round-robin: the selection lists the ranks in the log's order, and fits as the log ran
    rr = _hosts(tmp_path, ["a", "b"] * 4)
    with pytest.raises(InputError, match=r"\(e.g. 'dgx-h100:nodes=4\[ranks 0,8,1,9,2,10,3,11\]'\)"):
        calibrate_from_nccl_tests(DGX4, [rr], "dgx-h100:nodes=4")
    spec = "dgx-h100:nodes=4[ranks 0,8,1,9,2,10,3,11]"
    (lf,) = calibrate_from_nccl_tests(resolve(spec), [rr], spec).logs
    assert lf.scope == "network"


def test_the_cli_refuses_a_log_of_another_layout_in_one_line(tmp_path):
    topo = tmp_path / "h100-4x2.yaml"
    topo.write_text(dump_topology(H100_4X2))
    res = run_cli("calibrate", "--from-nccl-tests", str(ONE), "-t", str(topo))
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "1 host(s) (node005)" in res.stderr


def test_nvidia_devices_are_not_fitted_onto_an_xgmi_mesh_of_unknown_gpus():
    # probe's rocm-smi topology without --gpu-model names no GPU; its xGMI says AMD
    amd = load_topology_text(
        "name: amd-box\nnode:\n  gpus: {count: 8, mem_bw_gbps: 1000}\n  pcie: {generation: 5, bw_gbps: 55}\n"
        "  fabric: {kind: full-mesh, bw_gbps: 64}\n")
    with pytest.raises(InputError, match=r"ran on NVIDIA H100 80GB HBM3; amd-box's GPUs are joined by xGMI"):
        calibrate_from_nccl_tests(amd, [ONE])


def test_a_network_rate_above_the_line_rate_is_said():
    # the 4 x 8 H100 log ran on 400 Gb/s NICs; mapped onto 200 Gb/s ones its ports get 39 GB/s
    hdr = load_topology_text(dump_topology(DGX4).replace("bw_gbps: 50.0", "bw_gbps: 25.0"))
    said = [w for w in calibrate_from_nccl_tests(hdr, [FOUR]).warnings if "line rate" in w]
    assert len(said) == 1 and "above the 25 GB/s (200 Gb/s) line rate" in said[0]
    assert not [w for w in calibrate_from_nccl_tests(DGX4, [FOUR]).warnings if "line rate" in w]


def test_a_one_node_rate_above_the_links_figure_is_said():
    # The 8 x H100 all-reduce ran NVLS (the switch reduces): its bus bandwidth fits the ring
    # at 474 GB/s a link, above NVLink's 450; a one-node ring cannot move that.
    fitted = calibrate_from_nccl_tests(resolve("dgx-h100"), [FIX / "all_reduce_perf.8xh100-1node.txt"])
    said = [w for w in fitted.warnings if "the ring the fit assumes cannot move that" in w]
    assert len(said) == 1 and "got 474.4 GB/s a link, above the 450 GB/s of n0.gpu0's nvlink link" in said[0], said
    assert "NCCL_NVLS_ENABLE=0" in said[0]
    # a log within the links' figure (437.6 GB/s) is not warned of
    within = calibrate_from_nccl_tests(resolve("dgx-h100"), [FIX / "all_reduce_perf.8xh100-I1.txt"])
    assert not [w for w in within.warnings if "cannot move that" in w], within.warnings


def test_a_rate_under_half_the_links_figure_is_said_with_what_it_leaves_the_baselines():
    # The 2 x 8 H100 run moved 19.9 GB/s a NIC port of 50: plans time treeattn's transfers at
    # that, while NCCL's collectives (the baselines) keep the port's figure.
    fitted = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [FIX / "all_reduce_perf.2x8xh100-srun-l.txt"])
    said = [w for w in fitted.warnings if "under half the" in w]
    assert len(said) == 1 and "got 19.86 GB/s a link, under half the 50 GB/s of n0.nic0's infiniband link" in said[0]
    assert "keeps the hardware figure and predicts them faster than this log ran" in said[0]
    assert "this one's largest size is 8 GiB" in said[0], said
    # the 4 x 8 H100 run reached its ports' figure; the 8 x H100 one NVLink's
    for topo, log in ((DGX4, FOUR), (resolve("dgx-h100"), ONE)):
        assert not [w for w in calibrate_from_nccl_tests(topo, [log]).warnings if "under half" in w]


def _xxrjun_table(tmp_path: Path, table_id: str, name: str) -> Path:
    """One table of xxrjun's shipped cluster logs (results/published) as a log file of its own."""
    import yaml

    from treeattn.validate.corpus import corpus_dir

    mapping = yaml.safe_load((corpus_dir() / "xxrjun-nccl-tests-cluster.yaml").read_text())
    first, last = next(t for t in mapping["tables"] if t["id"] == table_id)["lines"]
    lines = (corpus_dir() / "xxrjun-nccl-tests-cluster.txt").read_text().splitlines()[first - 1:last]
    log = tmp_path / name
    log.write_text("\n".join(lines) + "\n")
    return log


def test_an_alltoall_log_sets_the_rail_link_to_the_ports_rate(tmp_path):
    # xxrjun's 2 x 8 H100 alltoall (92 GB/s of bus bandwidth): each rank sends half its buffer
    # to the other node, over its own 400 Gb/s NIC. Spread over the node's egress as a ring's
    # busbw is, the rail links had got 11.5 GB/s (a quarter of the port), and check-model on
    # the calibrated file gave +326 % on the same log; the same cluster's sendrecv fits 45.9.
    log = _xxrjun_table(tmp_path, "2node-g8-alltoall", "alltoall_perf.txt")
    cf = calibrate_from_log(read_nccl_tests(log))
    fitted = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [log])
    (net,) = fitted.logs
    assert net.fit.collective == "alltoall" and net.beta_gbps == pytest.approx(cf.beta_link_gbps * 8 * 8 / 15 / 8)
    assert 45 < net.beta_gbps < 50
    assert not [w for w in fitted.warnings if "under half" in w], fitted.warnings
    _scores_its_own_log_within(fitted.topology, log, 0.05, tmp_path)


def _alltoall_log(path: Path, hosts: list[str], port_gbps: float, alpha_us: float = 50.0, first_exp: int = 28,
                  rank_lines: bool = True) -> Path:
    """An alltoall log in nccl-tests 2.17's format, its figures made up (self-consistent): one
    rank a GPU, each with its own NIC of ``port_gbps``, the node with the most to send for its
    NICs setting the time; sizes 2^first_exp to 8 GiB."""
    n = len(hosts)
    lines = ["# Collective test starting: alltoall_perf",
             f"# nThread 1 nGpus 1 minBytes {2 ** first_exp} maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for r, h in enumerate(hosts if rank_lines else []):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r} on {h} device {hosts[:r].count(h):2d} [0000:1b:00] "
                     "NVIDIA H100 80GB HBM3")
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   "
              "algbw   busbw  #wrong", "#        (B)    (elements)                               (us)  (GB/s)  "
              "(GB/s)            (us)  (GB/s)  (GB/s)"]
    printed = []
    for k in range(first_exp, 34):
        count = (2 ** k // 8 // n) & ~1
        size = count * n * 8
        t = alpha_us + max((hosts.count(h) * (n - hosts.count(h)) * size / n / (hosts.count(h) * port_gbps * 1e3)
                            for h in set(hosts) if hosts.count(h) < n), default=0.0)
        alg, bus = size / t / 1e3, size / t / 1e3 * (n - 1) / n
        printed.append(round(bus, 2))
        lines.append(f"{size:12d}  {count:12d}    double    none      -1  {t:7.1f}  {alg:6.2f}  {bus:6.2f}       0  "
                     f"{t:7.1f}  {alg:6.2f}  {bus:6.2f}       0")
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(printed) / len(printed):.3f}", "#"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("hosts", "spec"), [(["a"] * 8 + ["b"] * 8, "dgx-h100:nodes=2"),
                                             (["a"] * 8 + ["b"] * 4, "dgx-h100:nodes=2[ranks 0-11]"),
                                             (["a"] * 4 + ["b"] * 8, "dgx-h100:nodes=2[ranks 0-3,8-15]")])
def test_an_alltoall_log_is_fitted_by_the_node_with_the_most_to_send(tmp_path, hosts, spec):
    # 8 + 4 ranks: the node of 4 sends 8/12 of each rank's buffer over 4 NICs, twice the time of
    # the node of 8; fitted by rank 0's node alone, its ports had come out at half their rate.
    log = _alltoall_log(tmp_path / "alltoall_perf.txt", hosts, 40.0)
    (net,) = calibrate_from_nccl_tests(resolve(spec), [log]).logs
    assert net.beta_gbps == pytest.approx(40.0, rel=0.01)


def test_logs_that_fit_one_class_give_one_topology_in_any_order(tmp_path):
    a2a = _xxrjun_table(tmp_path, "2node-g8-alltoall", "alltoall_perf.txt")
    sr = _xxrjun_table(tmp_path, "2node-g8-sendrecv", "sendrecv_perf.txt")
    topo = resolve("dgx-h100:nodes=2")
    one, two = (calibrate_from_nccl_tests(topo, logs) for logs in ([a2a, sr], [sr, a2a]))
    assert dump_topology(one.topology) == dump_topology(two.topology)
    # equal sizes: the sendrecv, one stream's rate as it stands, is kept
    assert [lf.fit.collective for lf in one.logs] == ["sendrecv"]
    assert any("kept " + str(sr) in w for w in one.warnings), one.warnings


def test_an_alltoall_log_without_rank_lines_counts_its_ranks_from_its_rows(tmp_path):
    # 80 ranks: busbw/algbw, printed to two decimals (0.9873), gives 79; size / (count x 8 B) gives 80.
    log = _xxrjun_table(tmp_path, "10node-g8-alltoall", "alltoall_perf.txt")
    parsed = read_nccl_tests(log)
    assert parsed.ranks is None
    name, n, notes = log_run(parsed)
    assert (name, n) == ("alltoall", 80) and "size / (count x element size)" in notes[0]
    # a sweep from 8 B prints size 0, count 0 below 16 B a rank: such rows say nothing of the ranks
    swept = _alltoall_log(tmp_path / "swept_alltoall_perf.txt", ["h"] * 80, 40.0, first_exp=3, rank_lines=False)
    assert "           0             0" in swept.read_text()
    assert log_run(read_nccl_tests(swept))[:2] == ("alltoall", 80)


def test_calibrating_again_from_the_same_log_keeps_the_rates():
    # Della's node as probed: NIC mlx5_0 at 200 Gb/s (ibstat), four more at 400 (--nic-gbps). The
    # share of the log's bandwidth each NIC gets was taken from the links' fitted rates, so each
    # pass from the same log moved it: 34.9, then 49.2, then 65.1 GB/s on mlx5_0's port.
    from treeattn.probe import ProbeOptions, probe

    probes = Path(__file__).parents[1] / "fixtures" / "probe"
    della = probe(ProbeOptions(nvidia_smi=probes / "nvidia-smi-topo-m.hgx-h100-della.txt",
                               ibstat=probes / "ibstat.cx6-hdr200-partial.nccl-tests-128.txt", nic_gbps=400,
                               nodes=4)).topology
    assert len({ln.bw_gbps for ln in della.links if ln.kind.value == "infiniband" and ln.dst.startswith("rail")}) > 1
    once = calibrate_from_nccl_tests(della, [ONE, FOUR]).topology
    twice = calibrate_from_nccl_tests(once, [ONE, FOUR]).topology
    assert [(ln.bw_gbps, ln.rated_gbps) for ln in twice.links] == [(ln.bw_gbps, ln.rated_gbps) for ln in once.links]


def test_a_log_given_twice_is_refused_as_check_model_does():
    # it was fitted twice and said as "X and X both fit class ...: kept X"
    res = run_cli("calibrate", "--from-nccl-tests", str(FOUR), str(FOUR), "-t", "dgx-h100:nodes=4")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == f"error: {FOUR}: given twice"


def test_a_shared_memory_ring_says_why_it_went_through_host_memory(tmp_path):
    # A ring through host memory because of the P2P level (here LOC, as NCCL_P2P_DISABLE=1
    # sets) is not one of GPUs without peer-to-peer: the H100s have it.
    h100 = resolve("dgx-h100")
    level = dataclasses.replace(h100, cost=h100.cost.updated(p2p_level="LOC"))
    (lf,) = calibrate_from_nccl_tests(level, [ONE]).logs
    said = next(n for n in lf.notes if "host memory" in n)
    assert lf.shm and "(GPUs further apart than NCCL's P2P level, LOC)" in said, said
    assert "without peer-to-peer" not in said


def test_a_host_memory_rate_beyond_the_gpus_pcie_links_is_warned_of(tmp_path):
    # An 8 x H100 NVSwitch log given for 8 RTX 4090s (no peer-to-peer): its ring is read as
    # NCCL's shared-memory transport, and its 474 GB/s would become the host's cost.shm_gbps,
    # though each GPU's data crosses its PCIe 4.0 x16 link to and from host memory. It was
    # written without a word, where a network class above its ports' line rate is warned of.
    log = tmp_path / ONE.name
    log.write_text(ONE.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"))
    family = resolve("rtx4090")
    result = calibrate_from_nccl_tests(family, [log])
    (lf,) = result.logs
    gpu_links = [ln for ln in family.links if ln.src == family.ranks[0] and ln.kind.value == "pcie"]
    bound = min(nccl_rates.pcie_nominal_gbps(ln) for ln in gpu_links)
    assert lf.shm and lf.beta_gbps > 1.05 * bound
    (said,) = [w for w in result.warnings if "through host memory" in w]
    assert f"got {lf.beta_gbps:.4g} GB/s, above the {bound:.4g} GB/s" in said and "cost.shm_gbps" in said
    # The CLI says it on stderr, as a warning, and still writes the fit (exit 0).
    out = tmp_path / "fitted.yaml"
    res = run_cli("calibrate", "-t", "rtx4090", "--from-nccl-tests", str(log), "-o", str(out))
    assert res.exit_code == 0 and out.exists()
    assert "warning:" in res.stderr and "above the" in " ".join(res.stderr.split())
    # A rate a host's memory path can carry (kalavai's 2 x RTX 4090) is not warned of.
    text = (Path(__file__).parents[2] / "results" / "published" / "kalavai-rtx4090.txt").read_text().splitlines()
    real = tmp_path / "all_reduce_perf.k8s-2gpu.txt"
    real.write_text("\n".join(text[147:187]) + "\n")
    real_fit = calibrate_from_nccl_tests(resolve("rtx4090:gpus=2"), [real])
    assert real_fit.logs[0].shm and not any("through host memory" in w for w in real_fit.warnings)
    # A PCIe link of unknown width is held to its own rate (a calibrated one without a
    # hardware rating to nothing).
    bare = dataclasses.replace(family, links=tuple(dataclasses.replace(ln, width=None) for ln in family.links))
    (said,) = [w for w in calibrate_from_nccl_tests(bare, [log]).warnings if "through host memory" in w]
    assert f"above the {min(ln.bw_gbps for ln in gpu_links):.4g} GB/s (its rate)" in said
    measured = dataclasses.replace(bare, cost=dataclasses.replace(bare.cost, link_rates="measured"))
    assert not any("through host memory" in w for w in calibrate_from_nccl_tests(measured, [log]).warnings)


def test_the_shipped_half_split_table_is_what_the_benchmark_prints(capsys, monkeypatch):
    """results/published/calibration-half-split.txt, quoted in results/published/README.md,
    is regenerated when the corpus or the fit changes (it had missed a new table)."""
    import importlib.util
    import sys

    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location("bench_half", root / "benchmarks" / "bench_calibrate_half_split.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["bench_calibrate_half_split.py"])
    assert bench.main() == 0
    shipped = (root / "results" / "published" / "calibration-half-split.txt").read_text()
    assert capsys.readouterr().out == shipped, (
        "results/published/calibration-half-split.txt is stale: regenerate with `.venv/bin/python "
        "benchmarks/bench_calibrate_half_split.py --out results/published/calibration-half-split.txt`")


def test_an_rccl_logs_release_is_not_written_as_an_nccl_release(tmp_path):
    # The 2-node MI300X run of the corpus prints "RCCL version : 2.22.3": RCCL's numbering, not
    # NCCL 2.22.3's figures; the calibrated topology keeps the model's release as the family does.
    from treeattn.validate.corpus import corpus_dir

    text = (corpus_dir() / "hisohara-ai-scripts-rccl.txt").read_text().splitlines()
    first = next(i for i, line in enumerate(text) if i >= 66 and line.startswith("# nThread"))
    last = next(i for i, line in enumerate(text) if i > first and line.startswith("# Avg bus bandwidth"))
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text("\n".join(text[first:last + 1]) + "\n")
    assert read_nccl_tests(log).rccl and printed_version(read_nccl_tests(log)) == "2.22.3"
    cal = calibrate_from_nccl_tests(resolve("mi300x:nodes=2"), [log])
    assert cal.topology.cost.nccl_version is None
    assert not any("NCCL 2.22.3" in w for w in cal.warnings)


def test_a_json_log_recording_an_algorithm_other_than_the_ring_is_warned_of(tmp_path):
    data = json.loads((FIX / "run.2x8xh100-I1.json").read_text())
    log = tmp_path / "run.json"
    log.write_text(json.dumps({**data, "env": [*data["env"], "NCCL_ALGO=Tree"]}))
    cal = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [log])
    assert (f"{log}: the run ran with NCCL_ALGO=Tree: NCCL ran no ring for all_reduce, and the fit takes one, so "
            "its rates are the other algorithm's") in cal.warnings
    # A list with the ring, NCCL 2.24's per-function lists giving all-reduce the ring: no warning.
    for algo in ("Ring,Tree", "tree;allreduce:ring", "allgather:tree"):
        log.write_text(json.dumps({**data, "env": [*data["env"], f"NCCL_ALGO={algo}"]}))
        warned = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [log]).warnings
        assert not any("NCCL ran no ring" in w or "ran with NCCL_ALGO" in w for w in warned), (algo, warned)
        # where the ring is one of several, NCCL's tuner picks: from 1 MiB on two nodes, the tree
        assert any("NCCL runs this all-reduce with its tree at 1 MiB-16 MiB, not a ring (by the model's reading of "
                   "NCCL's tuner, among what NCCL_ALGO allows)" in w for w in warned) == (algo == "Ring,Tree"), \
            (algo, warned)
    log.write_text(json.dumps({**data, "env": [*data["env"], "NCCL_ALGO=ring;allreduce:^ring"]}))
    assert any("ran no ring for all_reduce" in w
               for w in calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [log]).warnings)


def _corpus_table(tmp_path, source: str, table: str) -> Path:
    """One table of the shipped corpus cut out as a user's own log."""
    import yaml

    from treeattn.validate.corpus import corpus_dir

    mapping = yaml.safe_load((corpus_dir() / f"{source}.yaml").read_text())
    first, last = next(t["lines"] for t in mapping["tables"] if t["id"] == table)
    lines = (corpus_dir() / f"{source}.txt").read_text().splitlines()[first - 1:last]
    path = tmp_path / f"all_reduce_perf.{table}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fits_other_costs_set_are_warned_of(tmp_path):
    # -g 8 (Together's ring table): the small sizes are the launches of 8 kernels in a row
    got = calibrate_from_nccl_tests(resolve("dgx-h100"), [_corpus_table(tmp_path, "together-h100-1node", "ring")])
    assert sum("one process drove 8 GPUs (-g 8)" in w for w in got.warnings) == 1
    # NVIDIA's 8 H100s, one process a GPU: NCCL's all-reduce of 16 GiB there is NVLS, not the ring fitted
    got = calibrate_from_nccl_tests(resolve("dgx-h100"), [_corpus_table(tmp_path, "nvidia-dgxc-benchmarking-h100",
                                                                          "1node")])
    assert [w for w in got.warnings if "NVLink SHARP" in w] == [
        next(w for w in got.warnings if "NCCL runs this all-reduce with NVLink SHARP (NVLS) at 2 MiB-16 GiB, not a ring"
             in w)]
    assert not any("one process drove" in w for w in got.warnings)
    # said once where the fitted rate said it already (above the links' rating)
    assert sum("NVLink SHARP" in w for w in calibrate_from_nccl_tests(resolve("dgx-h100"), [ONE]).warnings) == 1
    # 218 us at 8 B on two MI300X nodes (hisohara's RoCE pair): a network latency 17 times the route's
    got = calibrate_from_nccl_tests(resolve("mi300x:nodes=2"),
                                    [_corpus_table(tmp_path, "hisohara-ai-scripts-rccl", "mi300x-2node")])
    assert any("network alpha 86.3 µs is 17 times the topology's route (5.2 µs)" in w for w in got.warnings)
    assert not any("times the topology's route" in w for w in calibrate_from_nccl_tests(DGX4, [FOUR]).warnings)


def test_the_settings_given_with_env_are_read_as_a_recorded_environment_is(tmp_path):
    log = _corpus_table(tmp_path, "together-h100-1node", "ring")  # Together ran it with NCCL_ALGO=Ring
    plain = calibrate_from_nccl_tests(resolve("dgx-h100"), [log])
    assert any("NVLink SHARP" in w for w in plain.warnings)
    ring = calibrate_from_nccl_tests(resolve("dgx-h100"), [log], env={"NCCL_ALGO": "Ring"})
    assert not any("NVLink SHARP" in w for w in ring.warnings)
    assert ring.topology == plain.topology  # what the fit writes does not change: what it says does
    tree = calibrate_from_nccl_tests(resolve("dgx-h100"), [log], env={"NCCL_ALGO": "Tree"})
    assert any("the run ran with NCCL_ALGO=Tree: NCCL ran no ring for all_reduce" in w for w in tree.warnings)
    res = run_cli("calibrate", "--from-nccl-tests", str(log), "-t", "dgx-h100", "--env", "NCCL_NVLS_ENABLE=0",
                  "-o", str(tmp_path / "c.yaml"))
    assert res.exit_code == 0 and "NVLink SHARP" not in res.stderr, res.stderr
    res = run_cli("calibrate", "--from-nccl-tests", str(log), "-t", "dgx-h100", "--env", "NCCL_ALGO")
    assert res.exit_code == 2 and "write NAME=VALUE" in res.stderr


def _rows_average(lines: list[str]) -> float:
    """nccl-tests' '# Avg bus bandwidth': the mean of every timing's busbw."""
    bus = [float(f[i]) for f in (ln.split() for ln in lines) if len(f) == 13 and f[0].isdigit() for i in (7, 11)]
    return sum(bus) / len(bus)


def test_the_algorithm_warning_reads_the_logs_release_and_sizes(tmp_path):
    # The 4-node log (NCCL 2.26.2) up to 1 GiB: by 2.26.2's figures NCCL runs NVLSTree at 2-256
    # MiB on these nodes and a ring at 512 MiB-1 GiB, by 2.30.7's NVLSTree at 1 GiB too; the
    # warning follows the release the log prints, and names the sizes.
    cut = tmp_path / "all_reduce_perf.txt"
    lines = FOUR.read_text().splitlines()
    keep = [ln for ln in lines if not (ln.split() and ln.split()[0].isdigit() and int(ln.split()[0]) > 1 << 30)
            and not ln.startswith("# Avg bus bandwidth")]  # the average of the rows cut: left out, as -b/-e runs
    cut.write_text("\n".join(keep).replace("maxBytes 17179869184", "maxBytes 1073741824") + "\n# Avg bus "
                   "bandwidth    : " + f"{_rows_average(keep):.4f}\n")
    from treeattn.calibrate.nccl_tests import read_nccl_tests

    assert read_nccl_tests(cut).rows[-1].size_bytes == 1 << 30
    got = calibrate_from_nccl_tests(DGX4, [cut]).warnings
    assert any("with its tree at 1 MiB, NVLink SHARP in the node and a tree across (NVLSTree) at 2 MiB-256 MiB, "
               "not a ring" in w for w in got), got
    cut.write_text(cut.read_text().replace("NCCL version 2.26.2+cuda12.8\n", ""))
    got = calibrate_from_nccl_tests(DGX4, [cut]).warnings
    assert any("(NVLSTree) at " in w and "-1 GiB, not a ring" in w for w in got), got
    # a host-memory ring (GPUs without peer-to-peer): the rate fitted is NCCL's shared-memory one
    chlc = _corpus_table(tmp_path, "chlc-rtx4090-epyc", "8gpu-stock-driver")
    warned = calibrate_from_nccl_tests(resolve("rtx4090-epyc2-8"), [chlc]).warnings
    assert any("its tree at 128 MiB, not a ring" in w and "the host-memory rate fitted is" in w for w in warned), \
        warned


def test_the_algorithm_warning_on_rccl_logs_names_what_keeps_msccl_off(tmp_path):
    # hisohara's 8 MI300X (RCCL 2.22.3 printed): RCCL's MSCCL all-pairs runs 1-16 MiB whatever
    # NCCL_ALGO says; RCCL_MSCCL_ENABLE=0 keeps it off
    log = _corpus_table(tmp_path, "hisohara-ai-scripts-rccl", "mi300x-1node")
    for env in ({}, {"NCCL_ALGO": "Ring"}):
        warned = calibrate_from_nccl_tests(resolve("mi300x"), [log], env=env).warnings
        said = next(w for w in warned if "not a ring" in w)
        assert "RCCL runs this all-reduce with RCCL's MSCCL all-pairs at 1 MiB-16 MiB" in said
        assert said.endswith("or a run with RCCL_MSCCL_ENABLE=0, gives theirs"), said
    off = calibrate_from_nccl_tests(resolve("mi300x"), [log], env={"RCCL_MSCCL_ENABLE": "0"}).warnings
    assert not any("not a ring" in w for w in off)
    # an NCCL release older than the model's figures: the topology's, as check-model takes it
    old = _corpus_table(tmp_path, "mit-orcd-orcd-benchmarks", "mghpcc-2node-g8")
    warned = calibrate_from_nccl_tests(resolve("dgx-h100:nodes=2"), [old], version="2.18.3").warnings
    assert any("not a ring" in w for w in warned), warned
    # RCCL's settings on an NCCL log are said to do nothing
    warned = calibrate_from_nccl_tests(DGX4, [FOUR], env={"RCCL_MSCCL_ENABLE": "0"}).warnings
    assert any("--env RCCL_MSCCL_ENABLE: RCCL's settings, and this log ran NCCL" in w for w in warned)


def test_a_factor_that_tells_no_rank_count_is_not_read_as_the_topologys(tmp_path):
    # broadcast's busbw/algbw is 1 at every count: without '#  Rank' lines the count is unknown,
    # whatever machine is named (it was read as the topology's 32 and fitted as the network's)
    table = _corpus_table(tmp_path, "superbench-a100-ndv4", "broadcast")
    log = tmp_path / "broadcast_perf.txt"
    log.write_text("\n".join(ln for ln in table.read_text().splitlines() if not re.match(r"#\s+Rank", ln)) + "\n")
    with pytest.raises(ProbeError, match="busbw = algbw for broadcast: the rank count is unknown"):
        calibrate_from_nccl_tests(resolve("dgx-a100:nodes=4"), [log])


def test_an_rccl_log_without_its_marker_line_is_still_told_as_rccls_on_amd_gpus(tmp_path):
    log = _corpus_table(tmp_path, "hisohara-ai-scripts-rccl", "mi300x-1node")
    log.write_text("\n".join(ln for ln in log.read_text().splitlines()
                             if "rccl-tests" not in ln and "RCCL version" not in ln) + "\n")
    warned = calibrate_from_nccl_tests(resolve("mi300x"), [log]).warnings
    assert any("on mi300x RCCL runs this all-reduce with RCCL's MSCCL all-pairs" in w for w in warned), warned
    off = calibrate_from_nccl_tests(resolve("mi300x"), [log], env={"RCCL_MSCCL_ENABLE": "0"}).warnings
    assert not any("RCCL's settings, and this log ran NCCL" in w or "not a ring" in w for w in off), off
