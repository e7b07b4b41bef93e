"""Workloads whose value head dim differs from the key's, and MLA's latent cache (DeepSeek):
what a rank holds and merges, how plan files and workload files carry them, and ``treeattn
run`` executing them against its reference."""

from __future__ import annotations

import json
import math

import pytest
import torch

import treeattn
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


@pytest.mark.parametrize("result", ["all", "heads"])
def test_run_executes_an_mla_plan_and_its_baselines_exactly(tmp_path, result):
    # 3 gloo ranks: each rank's latents are one (1, B, Hkv, N, D) tensor, V their first Dv
    # values; the plan, every baseline of its layout (ring attention moving latents, vLLM's
    # decode context parallel) and the reference all read them so
    import treeattn

    plan = treeattn.search_plan("cpu:ranks=3", "deepseek-v2-lite", batch=2, seq_len=300, result=result)
    path = tmp_path / "ds.yaml"
    treeattn.save_plan(plan, path)
    res = run_cli("run", str(path), "--baselines", "--repeats", "2", "--warmup", "1", "--json",
                  "--out", str(tmp_path / "rows.csv"))
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert {r["method"] for r in rows} >= {"plan", "ring-attention"} and all(r["correct"] for r in rows), rows
    assert all("D576 Dv512 latent" in r["workload"] for r in rows)


@pytest.mark.parametrize("latent", [True, False])
def test_the_sampled_rows_reference_agrees_with_the_exact_one(latent):
    # Above EXACT_MAX_KV_BYTES the reference combines each rank's row statistics: for MLA's
    # latents and for K beside V of another dim, as the one-softmax reference gives
    from treeattn.exec.attention import kv_shape, make_kv_shard, make_query
    from treeattn.exec.reference import combine_stats, exact_attention, row_stats

    w = Workload(batch=2, q_heads=4, kv_heads=1, head_dim=24, v_head_dim=16, kv_latent=latent, split=(9, 0, 13),
                 kv_dtype="fp32")
    q = make_query(w, 1)
    shards = [make_kv_shard(w, r, 1) for r in range(3)]
    assert [tuple(s.shape) for s in shards] == [kv_shape(w, n) for n in w.split]
    assert shards[0].numel() * 4 == w.kv_bytes(0)
    exact = exact_attention(q, shards, 16)
    rows = torch.arange(w.rows)
    sampled = combine_stats(torch.stack([row_stats(q, s, rows, 16) for s in shards]))
    assert exact.shape == (8, 17) and torch.allclose(sampled, exact, atol=1e-6)


def test_the_fused_kernels_take_one_head_dim_only():
    from treeattn.errors import InputError
    from treeattn.exec.attention import choose_kernel

    assert choose_kernel("auto", "cuda", "bf16", 576, (9, 0), True, 512) == "explicit"
    assert choose_kernel("auto", "cpu", "bf16", 64, None, False, 32) == "explicit"
    assert choose_kernel("auto", "cuda", "bf16", 128, (9, 0), True, 128) == "flash-attn"
    with pytest.raises(InputError, match=r"kernel sdpa-flash does not take bf16 KV with head dims 576 \(K\) and "
                                         r"512 \(V\) on CUDA"):
        choose_kernel("sdpa-flash", "cuda", "bf16", 576, (9, 0), False, 512)


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
    # A file's keys: the file named once, at the start (not "FILE: v_head_dim ... FILE: head_dim").
    bad = tmp_path / "mla.yaml"
    bad.write_text("model: deepseek-v3\nv_head_dim: 576\nhead_dim: 512\nkv_latent: true\n")
    res = run_cli("plan", "-t", "dgx-h100", "-n", "128K", "--workload", str(bad), "-o", str(tmp_path / "m.yaml"))
    assert res.exit_code == 2 and res.stderr == (
        f"error: {bad}: v_head_dim (576) must be at most head_dim (512) with a latent cache (kv_latent): the value "
        "is the first Dv values of the cached key\n"), res.stderr
    # --no-kv-latent over the preset: K and V cached apart, 576 + 512 values a token
    res = run_cli("plan", "-t", "dgx-h100", "-m", "deepseek-v3", "--no-kv-latent", "-n", "128K", "--json",
                  "-o", str(tmp_path / "apart.yaml"))
    assert res.exit_code == 0 and "kv_latent" not in json.loads(res.stdout)["workload"]


def test_a_raw_payload_has_no_value_dim():
    # A raw buffer has no heads: no Dv to ask of it (a property reading absent fields raised AttributeError)
    from treeattn.workload import RawPayload

    assert "value_dim" not in dir(RawPayload)
    assert "value_dim" in dir(Workload)


@pytest.mark.parametrize("extra", [("--bytes", "1M"), ("--workload", "RAW")])
def test_a_refused_no_kv_latent_is_named_as_typed(tmp_path, extra):
    raw = tmp_path / "raw.yaml"
    raw.write_text("kind: raw\nbytes: 1M\n")
    args = [str(raw) if a == "RAW" else a for a in extra]
    res = run_cli("plan", "-t", "dgx-h100", *args, "--no-kv-latent")
    assert res.exit_code == 2 and "(--no-kv-latent)" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_workload_file_of_one_model_takes_its_lengths_and_preset_from_flags(tmp_path):
    """A file that describes a model (Kimi-K2's MLA shape) and no length: flags override a
    file's keys (docs/workload-format.md), yet `plan --workload F -n 8K` and `compare --workload
    F --seq-lens ...` (which ignores a file's seq_len) were refused with 'give seq_len', and a
    file of batch and length with `-m deepseek-v3` with 'give a model preset'."""
    kimi = tmp_path / "kimi-k2.yaml"
    kimi.write_text("q_heads: 64\nkv_heads: 1\nhead_dim: 576\nv_head_dim: 512\nkv_latent: true\nlayers: 61\n"
                    "batch: 8\n")
    out = tmp_path / "p.yaml"
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(kimi), "-n", "8K", "-o", str(out), "--json",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    w = json.loads(res.stdout)["workload"]
    assert (w["q_heads"], w["head_dim"], w["v_head_dim"], w["kv_latent"], w["seq_len"], w["batch"]) == (
        64, 576, 512, True, 8192, 8)
    res = run_cli("compare", "-t", "dgx-h100", "--workload", str(kimi), "--seq-lens", "8K,16K", "--json",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert {r["seq_len"] for r in json.loads(res.stdout)["rows"]} == {8192, 16384}
    sized = tmp_path / "sized.yaml"
    sized.write_text("batch: 4\nseq_len: 16K\n")
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(sized), "-m", "deepseek-v3", "-o", str(out), "--json",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    w = json.loads(res.stdout)["workload"]
    assert (w["model"], w["batch"], w["seq_len"], w["v_head_dim"]) == ("deepseek-v3", 4, 16384, 512)
    # Neither the file nor a flag: refused as before, naming the file.
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(kimi), "-o", str(out), "--no-progress")
    assert res.exit_code == 2 and res.stderr == f"error: {kimi}: give seq_len (tokens in all), e.g. seq_len: 128K\n"
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(sized), "-o", str(out), "--no-progress")
    assert res.exit_code == 2 and "give a model preset or both q_heads" in res.stderr, res.stderr


@pytest.mark.parametrize("text", ["", "# batch and length from flags\n", "workload:\n", "{}\n"])
def test_a_workload_file_of_no_key_takes_everything_from_flags(tmp_path, text):
    # As a file of {} did; an empty one (comments only, a bare 'workload:') asked for seq_len, given as -n.
    empty = tmp_path / "w.yaml"
    empty.write_text(text)
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(empty), "-m", "llama-3.1-8b", "-n", "4K", "--json",
                  "-o", str(tmp_path / "p.yaml"), "--no-progress")
    assert res.exit_code == 0, res.stderr
    w = json.loads(res.stdout)["workload"]
    assert (w["model"], w["seq_len"], w["batch"]) == ("llama-3.1-8b", 4096, 1)
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(empty), "-m", "llama-3.1-8b", "--no-progress")
    assert res.exit_code == 2 and res.stderr == f"error: {empty}: give seq_len (tokens in all), e.g. seq_len: 128K\n"


def test_compare_json_carries_the_shape_its_text_names():
    res = run_cli("compare", "-t", "dgx-h100", "-m", "deepseek-v3", "--seq-lens", "8K", "--no-progress", "--json")
    assert res.exit_code == 0, res.stderr
    shape = json.loads(res.stdout)["workload"]
    assert (shape["q_heads"], shape["head_dim"], shape["v_head_dim"], shape["kv_latent"], shape["layers"]) == (
        128, 576, 512, True, 61)
    assert "seq_len" not in shape and "split" not in shape


def test_config_jsons_v_head_dim_on_a_latent_preset_is_warned_about(tmp_path):
    # DeepSeek-V3's config.json says v_head_dim: 128, the value a head has after the
    # up-projection; its absorbed decode merges the latent's 512 (kv_lora_rank).
    note = "warning: deepseek-v3's absorbed decode merges the first 512 values of its latent a head (kv_lora_rank)"
    res = run_cli("plan", "-t", "dgx-h100", "-m", "deepseek-v3", "--v-head-dim", "128", "-n", "8K",
                  "-o", str(tmp_path / "p.yaml"), "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert res.stderr.count(note) == 1, res.stderr
    res = run_cli("compare", "-t", "dgx-h100", "-m", "deepseek-v3", "--v-head-dim", "128", "--seq-lens", "8K,16K",
                  "--no-progress", "--json")
    assert res.exit_code == 0 and res.stderr.count(note) == 1, res.stderr
    for args in (["--v-head-dim", "512"], ["--v-head-dim", "128", "--no-kv-latent"], []):
        res = run_cli("plan", "-t", "dgx-h100", "-m", "deepseek-v3", "-n", "8K", *args,
                      "-o", str(tmp_path / "q.yaml"), "--no-progress")
        # (its FP8 weights, 78 GiB a GPU over 8 H100s, are warned about: weights_note)
        assert res.exit_code == 0 and "absorbed decode" not in res.stderr, (args, res.stderr)
    with pytest.warns(UserWarning, match=r"v_head_dim 128 merges 128\. config\.json's v_head_dim"):
        treeattn.search_plan("dgx-h100", "deepseek-v3", batch=1, seq_len=8192, v_head_dim=128)


@pytest.mark.parametrize("text", ["", "kind: raw\n", "kind: raw\ndtype: bf16\n"])
def test_bytes_gives_the_size_a_raw_or_empty_workload_file_leaves_out(tmp_path, text):
    # Flags override a file's keys; --bytes did not give a raw file its size ('a raw payload
    # needs bytes'), and an empty file with --bytes asked for seq_len.
    f = tmp_path / "w.yaml"
    f.write_text(text)
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(f), "--bytes", "1M", "--json", "-o",
                  str(tmp_path / "p.yaml"), "--no-progress")
    assert res.exit_code == 0, res.stderr
    w = json.loads(res.stdout)["workload"]
    assert (w["kind"], w["nbytes"], w["dtype"]) == ("raw", 1 << 20, "bf16" if "bf16" in text else "fp32")
    res = run_cli("plan", "-t", "dgx-h100", "--workload", str(f), "--no-progress")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.stderr


def test_a_latent_cache_for_a_model_without_mla_is_warned_about(tmp_path):
    # llama-3.1-8b --kv-latent halved its KV cache (and the lower bound) without a word
    res = run_cli("plan", "-t", "cpu-4", "-m", "llama-3.1-8b", "--kv-latent", "-n", "4K",
                  "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines()[0] == (
        "warning: llama-3.1-8b is no MLA model: it caches K and V a KV head each, and a latent cache (kv_latent, "
        "--kv-latent) keeps one, half its KV cache's bytes"), res.stderr
    res = run_cli("plan", "-t", "cpu-4", "-m", "deepseek-v2-lite", "-n", "4K", "-o", str(tmp_path / "q.yaml"))
    assert res.exit_code == 0 and "MLA" not in res.stderr, res.stderr
