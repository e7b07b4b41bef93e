"""Compute microbenchmarks of ``treeattn calibrate``: the executor's kernels, sizes and bytes moved."""

from __future__ import annotations

import math

import pytest

from treeattn.calibrate.compute import measure_compute, rank_threads
from treeattn.errors import InputError


@pytest.mark.parametrize(
    ("kernel", "sizes", "want"),
    [
        # sum: fp32 buffers, reads two and writes one.
        ("sum", [4, 1 << 24], [(4, 12), (1 << 24, 3 << 24)]),
        # merge: whole packed rows of D + 1 = 129 fp32 (516 B); below one row nothing runs.
        ("merge", [100, 516 * 10, 516 * 16384], [(5160, 15480), (516 * 16384, 3 * 516 * 16384)]),
    ],
)
def test_bytes_moved_follow_the_compute_model(kernel, sizes, want):
    # Sizes far apart: the fit needs the large one slower than the small one, however loaded the machine.
    fit = measure_compute(kernel, sizes, repeats=5, threads=1, budget_s=0.5)
    assert [(p.nbytes, p.moved_bytes) for p in fit.points] == want
    assert fit.kernel == kernel and fit.threads == 1
    assert all(math.isfinite(p.median_us) and p.median_us > 0 for p in fit.points)
    assert fit.launch_us >= 0 and math.isfinite(fit.eff_bw_gbps)


def test_attention_moves_kv_query_and_partial():
    fit = measure_compute("attention", [4096, 4096 * 2048], repeats=3, threads=1, budget_s=0.5)
    # 1 token of llama-3.1-8b bf16 KV is 4096 B; q is 32 x 128 bf16; the partial 32 x 129 fp32.
    assert [(p.nbytes, p.moved_bytes) for p in fit.points] == [(4096, 4096 + 8192 + 16512),
                                                               (4096 * 2048, 4096 * 2048 + 8192 + 16512)]


def test_clone_is_the_executor_set_up():
    fit = measure_compute("clone", [64, 1 << 24], repeats=3, threads=1, budget_s=0.5)
    assert [(p.nbytes, p.moved_bytes) for p in fit.points] == [(64, 128), (1 << 24, 2 << 24)]


def test_refusals_and_thread_count(monkeypatch):
    with pytest.raises(InputError, match="unknown compute kernel"):
        measure_compute("fft", [4, 64])
    with pytest.raises(InputError, match="at least two sizes"):
        measure_compute("merge", [4, 64, 516])
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(4) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert rank_threads(10**6) == 1


def test_fit_takes_launch_from_small_sizes_and_bandwidth_from_large_ones():
    from treeattn.calibrate.compute import ComputePoint, fit_compute

    # Cached sizes run faster per byte than the line through the memory-bound ones: launch
    # comes from the former, bandwidth (2 GB/s) from the latter only.
    pts = [ComputePoint(n, 3 * n, 5.0 + 3 * n / (2e6 if n < 1 << 20 else 2e3)) for n in (64, 1024, 1 << 20, 1 << 24)]
    fit = fit_compute(pts)
    assert fit.alpha_us == pytest.approx(5.0, rel=0.01) and fit.beta_gbps == pytest.approx(2.0, rel=0.01)
    assert fit.residuals[-1] == pytest.approx(0.0, abs=1.0)


def test_a_kernel_whose_timings_do_not_follow_the_line_is_warned_about():
    from treeattn.calibrate.compute import ComputeFit, ComputePoint, fit_compute, poor_fit_note

    line = [ComputePoint(n, n, 5.0 + n / 2e3) for n in (64, 1024, 1 << 20, 1 << 24)]
    good = ComputeFit("attention", 1, tuple(line), fit_compute(line))
    assert good.fit.r2 > 0.99 and poor_fit_note(good, "attn_launch_us and attn_gbps") is None
    # Times set by something other than the bytes: the small sizes as slow as the large ones,
    # and one large size far slower than the next.
    odd = [ComputePoint(64, 64, 900.0), ComputePoint(1024, 1024, 40.0), ComputePoint(1 << 20, 1 << 20, 5000.0),
           ComputePoint(1 << 24, 1 << 24, 1000.0)]
    bad = ComputeFit("attention", 1, tuple(odd), fit_compute(odd))
    assert bad.fit.r2 < 0
    note = poor_fit_note(bad, "attn_launch_us and attn_gbps")
    assert note is not None and "attention kernel" in note and "attn_launch_us and attn_gbps" in note
    assert f"R² {bad.fit.r2:.3g}" in note
