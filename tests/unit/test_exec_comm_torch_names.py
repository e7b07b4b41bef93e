"""``Comm``'s gathers and reduce-scatters on a torch older than 2.13, which names them
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (2.13 added the ``_single`` names):
a GPU machine's own torch may be such a one, and every run gathers (the clock check, the
results). A gloo group of this process alone, with the new names taken away or kept."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from treeattn.exec.comm import Comm
from treeattn.exec.launch import free_port


@pytest.fixture
def gloo_world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield Comm(0, 1, "gloo", torch.device("cpu"), 5.0, 5.0)
    dist.destroy_process_group()


def _gather_and_scatter(comm: Comm) -> None:
    x = torch.arange(6, dtype=torch.float32).view(3, 2)
    assert torch.equal(comm.all_gather(x, "gather"), x.unsqueeze(0))
    assert comm.digests("same text", "digests") == comm.digests("same text", "digests again")
    out = torch.empty(3, 2)
    assert torch.equal(comm.reduce_scatter(out, x, "sum", "reduce-scatter"), x)


@pytest.mark.parametrize("name", ["all_gather_single", "reduce_scatter_single"])
def test_a_torch_without_the_single_names_gathers_by_the_old_ones(gloo_world_of_one, monkeypatch, name):
    called: list[str] = []
    old = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}[name]
    real = getattr(dist, old)
    monkeypatch.delattr(dist, name, raising=False)
    monkeypatch.setattr(dist, old, lambda *a, **kw: called.append(old) or real(*a, **kw))
    _gather_and_scatter(gloo_world_of_one)
    assert called


@pytest.mark.skipif(not hasattr(dist, "all_gather_single"), reason="this torch predates the _single names")
def test_a_torch_with_the_single_names_uses_them(gloo_world_of_one, monkeypatch):
    def refuse(*a, **kw):  # noqa: ANN002, ANN003, ANN202 - any call
        raise AssertionError("the deprecated name was called")

    monkeypatch.setattr(dist, "all_gather_into_tensor", refuse)
    monkeypatch.setattr(dist, "reduce_scatter_tensor", refuse)
    _gather_and_scatter(gloo_world_of_one)
