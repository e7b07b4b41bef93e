"""Workloads whose value head dim differs from the key's, and MLA's latent cache (DeepSeek):
what a rank holds and merges, how plan files and workload files carry them, and what
``treeattn run`` says of them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.cli_helpers import run_cli
from treeattn.errors import WorkloadError
from treeattn.workload import MODELS, Workload


def test_deepseek_v3_caches_one_latent_of_576_values_a_token_and_merges_512():
    w = Workload.create(ranks=8, seq_len=131072, model="deepseek-v3")
    assert (w.q_heads, w.kv_heads, w.head_dim, w.value_dim, w.kv_latent, w.layers) == (128, 1, 576, 512, True, 61)
    # 576 bf16 values a token and layer: 70,272 bytes a token over 61 layers, DeepSeek-V3's
    # ~70 KB a token (the DeepSeek-V2 paper's KV cache per token, at V3's layer count)
    assert w.cache_bytes(0) == 61 * 16384 * 576 * 2
    assert w.row_bytes == 512 * 4 + 4 and w.acc_row_bytes == 513 * 4
    assert w.payload_bytes == 128 * (512 * 4 + 4)


def test_separate_k_and_v_of_different_dims_count_both():
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=192, v_head_dim=128, split=(10, 0))
    assert w.kv_bytes(0) == 2 * 2 * 10 * (192 + 128) * 2 and w.kv_bytes(1) == 0
    assert w.row_bytes == 128 * 4 + 4


def test_a_value_dim_equal_to_the_key_dim_is_the_same_workload():
    plain = Workload(batch=1, q_heads=4, kv_heads=4, head_dim=64, split=(8, 8))
    same = Workload(batch=1, q_heads=4, kv_heads=4, head_dim=64, split=(8, 8), v_head_dim=64)
    assert same == plain and same.to_dict() == plain.to_dict()
    assert "v_head_dim" not in plain.to_dict() and "kv_latent" not in plain.to_dict()


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"v_head_dim": 0}, "workload.v_head_dim must be a positive integer, got 0"),
    ({"v_head_dim": True}, "workload.v_head_dim must be a positive integer, got True"),
    ({"v_head_dim": 80, "kv_latent": True}, "workload.v_head_dim (80) must be at most head_dim (64) with kv_latent"),
    ({"kv_latent": "yes"}, "workload.kv_latent must be true or false, got 'yes'"),
])
def test_bad_value_dims_are_refused(kwargs, needle):
    with pytest.raises(WorkloadError) as exc:
        Workload(batch=1, q_heads=4, kv_heads=1, head_dim=64, split=(8,), **kwargs)
    assert needle in str(exc.value)


def test_plan_files_carry_the_mla_shape_and_leave_others_as_they_were(tmp_path):
    import treeattn

    plan = treeattn.search_plan("dgx-h100", "deepseek-v3", batch=2, seq_len="64K")
    path = tmp_path / "ds.yaml"
    treeattn.save_plan(plan, path)
    text = path.read_text()
    assert "v_head_dim: 512" in text and "kv_latent: true" in text
    again = treeattn.load_plan(path)
    assert again.workload == plan.workload and again.workload.payload_bytes == 2 * 128 * (512 * 4 + 4)
    llama = treeattn.search_plan("dgx-h100", "llama-3.1-8b", batch=2, seq_len="64K")
    treeattn.save_plan(llama, tmp_path / "llama.yaml")
    assert "v_head_dim" not in (tmp_path / "llama.yaml").read_text()


def test_a_transfer_moves_rows_of_dv_values():
    from treeattn.plan.builders import build
    from treeattn.plan.ir import TopologyRef, message_bytes

    w = Workload(batch=1, q_heads=16, kv_heads=1, head_dim=576, v_head_dim=512, kv_latent=True, split=(64, 64))
    plan = build("binomial", w, TopologyRef("cpu:ranks=2", ""))
    sends = [op for prog in plan.programs for op in prog if op.kind.value == "send"]
    assert sends and all(message_bytes(plan, op) == 16 * (512 * 4 + 4) for op in sends)


def test_workload_files_and_the_api_take_the_keys(tmp_path):
    from treeattn.search.workload_file import load_workload, workload_from_dict

    f = tmp_path / "w.yaml"
    f.write_text("q_heads: 16\nkv_heads: 1\nhead_dim: 576\nv_head_dim: 512\nkv_latent: true\nseq_len: 1K\n")
    w = load_workload(f, ranks=4)
    assert (w.value_dim, w.kv_latent, w.kv_bytes(0)) == (512, True, 256 * 576 * 2)
    with pytest.raises(WorkloadError, match="kv_latent must be true or false, got 'yes'"):
        workload_from_dict({"q_heads": 4, "head_dim": 8, "kv_latent": "yes", "seq_len": 8}, ranks=2)
    import treeattn

    plan = treeattn.build_plan("cpu:ranks=2", "llama-3.1-8b", "binomial", batch=1, seq_len=64, v_head_dim=64)
    assert (plan.workload.head_dim, plan.workload.value_dim) == (128, 64)
    # a preset's shape, and a preset named over a file's MLA keys drops them with its heads
    assert workload_from_dict({"model": "deepseek-v2-lite", "seq_len": 8}, ranks=2).value_dim == 512
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(f), "-m", "llama-3.1-8b", "--json",
                  "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    shape = json.loads(res.stdout)["workload"]
    assert (shape["head_dim"], shape["kv_heads"]) == (128, 8) and "v_head_dim" not in shape


def test_run_refuses_an_mla_plan_in_one_line_before_anything_runs(tmp_path):
    import treeattn

    plan = treeattn.build_plan("cpu:ranks=2", "deepseek-v2-lite", "binomial", batch=1, seq_len=64)
    path = tmp_path / "ds.yaml"
    treeattn.save_plan(plan, path)
    out = tmp_path / "rows.csv"
    res = run_cli("run", str(path), "--out", str(out))
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "error: ds.yaml: treeattn run executes K and V of one head dim; this workload's value dim is 512, its "
        "key's 576 (an MLA latent cache): plan, simulate, verify and the Python API (Merger, attention_partial) "
        "take it"]
    assert not out.exists()


def test_attention_partial_takes_values_of_another_dim():
    from treeattn.exec.attention import attention_partial

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 8, 24, generator=g), torch.randn(2, 1, 37, 24, generator=g)
    v = k[..., :16]
    o, lse = attention_partial(q, k, v)
    scores = torch.einsum("bhd,bnd->bhn", q.double(), k[:, 0].double()) / math.sqrt(24)
    assert tuple(o.shape) == (2, 8, 16)
    assert torch.allclose(o.double(), torch.softmax(scores, -1) @ v[:, 0].double(), atol=1e-5)
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=1e-5)
    o, lse = attention_partial(q, k[:, :, :0], v[:, :, :0])
    assert tuple(o.shape) == (2, 8, 16) and not o.any() and lse.eq(float("-inf")).all()
    with pytest.raises(ValueError, match="value head dimension must be at least 1"):
        attention_partial(q, k, k[..., :0])


def test_every_preset_is_a_valid_workload():
    for name in MODELS:
        assert Workload.create(ranks=2, seq_len=16, model=name).model == name


def test_the_cli_takes_value_dims_and_names_the_flag_that_conflicts(tmp_path):
    res = run_cli("plan", "-t", "dgx-h100", "--heads", "64", "--kv-heads", "1", "--head-dim", "576",
                  "--v-head-dim", "512", "--kv-latent", "-n", "128K", "--json", "-o", str(tmp_path / "k.yaml"))
    assert res.exit_code == 0, res.stderr
    shape = json.loads(res.stdout)["workload"]
    assert (shape["v_head_dim"], shape["kv_latent"]) == (512, True)
    for args, needle in [
        (("-m", "llama-3.1-8b", "--kv-latent", "--v-head-dim", "200"),
         "error: --v-head-dim (200) must be at most llama-3.1-8b's head dim (128) with a latent cache (--kv-latent)"),
        (("-m", "deepseek-v3", "--head-dim", "256"),
         "error: deepseek-v3's value dim (512) must be at most --head-dim (256) with a latent cache (deepseek-v3's)"),
        (("-m", "deepseek-v3", "--v-head-dim", "0"), "error: --v-head-dim must be a positive integer, got 0"),
    ]:
        res = run_cli("plan", "-t", "dgx-h100", "-n", "128K", *args)
        assert res.exit_code == 2 and res.stderr.startswith(needle), (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    # --no-kv-latent over the preset: K and V cached apart, 576 + 512 values a token
    res = run_cli("plan", "-t", "dgx-h100", "-m", "deepseek-v3", "--no-kv-latent", "-n", "128K", "--json",
                  "-o", str(tmp_path / "apart.yaml"))
    assert res.exit_code == 0 and "kv_latent" not in json.loads(res.stdout)["workload"]
