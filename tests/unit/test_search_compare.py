"""``treeattn.search.compare``: the tree's row is the plan ``treeattn plan`` would pick."""

from __future__ import annotations

from treeattn.cost.memory import DEFAULT_MEM_FRACTION, device_bytes
from treeattn.search.compare import compare
from treeattn.search.search import search
from treeattn.topology.library import resolve
from treeattn.workload import MODELS, Workload

TOPO = resolve("dgx-h100")


def _tokens_short_of_the_limit(slack_tokens: int) -> int:
    """A sequence length for Llama-3.1-8B (B = 1, bf16) over dgx-h100's 8 GPUs whose KV cache
    per GPU is ``slack_tokens`` tokens short of what the default fraction allows."""
    m = MODELS["llama-3.1-8b"]
    per_token = 2 * m.kv_heads * m.head_dim * 2 * m.layers  # K and V of every layer, bf16
    limit = int(device_bytes(TOPO, 0) * DEFAULT_MEM_FRACTION)
    return (limit // per_token - slack_tokens) * TOPO.num_ranks


def _make(p: int, n: int) -> Workload:
    return Workload.create(ranks=p, seq_len=n, model="llama-3.1-8b")


def test_the_tree_is_the_fastest_plan_that_fits():
    # One token (128 KiB) short of the limit: an exchange holding 7 received partials (about
    # 140 KB with the query and its own) does not fit, the two all-reduces (41 KB) do. The tree
    # row must be what `plan` picks on the same input, not a faster schedule that does not fit.
    n = _tokens_short_of_the_limit(1)
    [tree, *_] = compare([TOPO], [n], _make)
    want = search(TOPO, _make(TOPO.num_ranks, n), top_k=1)
    assert tree.method == "tree" and tree.fits is True
    assert tree.predicted_us == want.best.predicted_us and tree.detail == want.candidates[0].algorithm


def test_where_nothing_fits_the_tree_is_still_timed_and_marked():
    # The KV cache alone fills the limit: every method holds more, so none fits; the tree's
    # row still shows the fastest schedule, marked, as the other methods' rows are.
    rows = compare([TOPO], [_tokens_short_of_the_limit(0)], _make)
    assert {r.fits for r in rows if r.predicted_us is not None} == {False}
    assert rows[0].method == "tree" and rows[0].predicted_us is not None


def test_the_plot_tells_apart_two_topologies_of_one_rank_count(monkeypatch):
    # dgx-h100 and hgx-h200 both have 8 ranks: "8 ranks" alone would not say which line is which.
    import treeattn.search.compare as mod

    shown: list[str] = []
    monkeypatch.setattr(mod, "save_figure", lambda fig, path: shown.extend(
        t.get_text() for t in fig.axes[0].get_legend().get_texts()))
    rows = compare([TOPO, resolve("hgx-h200")], [8192], _make)
    mod.plot_speedup(rows, "unused.png")
    assert shown == ["8 ranks (dgx-h100): vs ring attention", "8 ranks (dgx-h100): vs 2 all-reduces",
                     "8 ranks (hgx-h200): vs ring attention", "8 ranks (hgx-h200): vs 2 all-reduces"], shown
    shown.clear()
    mod.plot_speedup([r for r in rows if r.topology == "dgx-h100"], "unused.png")
    assert shown == ["8 ranks: vs ring attention", "8 ranks: vs 2 all-reduces"], shown


def test_ring_attention_above_its_rank_cap_is_left_out_saying_why(monkeypatch):
    # Ring attention's plan holds about 3p² operations (6 GB at 2,048 ranks): above the cap its
    # row has no time, and its detail says why; every other method is still timed.
    from treeattn.search import compare as compare_module

    monkeypatch.setattr(compare_module, "COMPARE_RING_MAX_RANKS", 4)
    rows = {r.method: r for r in compare([TOPO], [1 << 17], _make)}
    ring = rows["ring-attention"]
    assert ring.predicted_us is None and ring.fits is None
    assert ring.detail == "not simulated above 4 ranks: its plan would hold 168 operations (about 77.11 KiB of memory)"
    assert rows["allreduce3"].predicted_us is not None and rows["tree"].predicted_us is not None


def test_devices_of_different_memory_judge_baselines_by_each_ranks_own_limit(tmp_path):
    # GPU 3 has half the memory of the others, and rank 0 holds most of the KV: rank 0's peak
    # is over GPU 3's limit but within its own. plan judged the baselines' largest rank against
    # the limit its last candidate left behind (left out, "over the 36 GiB"), compare by each
    # rank's own; both now take memory_check's rank nearest its own limit.
    devices = "\n".join(f"  - {{name: gpu{i}, kind: gpu, model: A100-PCIE-80GB, mem_bw_gbps: 1935, "
                        f"mem_gb: {40 if i == 3 else 80}}}" for i in range(4))
    links = "\n".join(f"  - {{src: gpu{i}, dst: cpu0, kind: pcie, bw_gbps: 25, latency_us: 0.5, duplex: true}}"
                      for i in range(4))
    path = tmp_path / "mixed.yaml"
    path.write_text(f"name: mixed\ndevices:\n  - {{name: cpu0, kind: cpu}}\n{devices}\nlinks:\n{links}\n"
                    "ranks: [\"gpu{0..3}\"]\n")
    topo = resolve(str(path))
    split = (491520, 1024, 1024, 270336)

    def make(p: int, n: int) -> Workload:
        return Workload.create(ranks=p, seq_len=n, model="llama-3.1-8b", split=split)

    found = search(topo, make(4, sum(split)), top_k=1)
    assert not [x for x in found.left_out if x.get("baseline")]
    rows = {r.method: r for r in compare([topo], [sum(split)], make)}
    for name, key in (("allreduce2", "allreduce2_us"), ("allreduce3", "allreduce3_nccl_us"),
                      ("allgather-merge", "allgather_merge_us")):
        assert rows[name].fits and found.baseline_peak_bytes[key] == rows[name].peak_bytes, name
