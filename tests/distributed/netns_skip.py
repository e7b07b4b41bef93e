"""Marks for tests that build emulated clusters: skipped, with the emulator's own reason,
where this process cannot create network namespaces (not root, or no iproute2)."""

from __future__ import annotations

import pytest

from treeattn.emulate.netns import require_netns
from treeattn.errors import EmulationError


def why_no_netns() -> str | None:
    try:
        require_netns()
    except EmulationError as exc:
        return str(exc)
    return None


NETNS = [pytest.mark.netns, pytest.mark.skipif(why_no_netns() is not None, reason=str(why_no_netns()))]
