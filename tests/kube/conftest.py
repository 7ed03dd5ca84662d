"""Fixtures of the Kubernetes stand-in's tests: a shared stand-in, fresh ones, and kr8s clients of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import kr8s.asyncio
import pytest

from keraunos.testing.kube import KubeStandIn, start_kube

#: Fast clocks for tests: retries, grace periods and resyncs in tenths of a second.
FAST = (
    "--retry-backoff-seconds",
    "0.05",
    "--max-grace-seconds",
    "0.5",
    "--resync-seconds",
    "0.1",
    "--follow-poll-seconds",
    "0.05",
)

StartKube = Callable[..., KubeStandIn]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStandIn]:
    """One stand-in shared by a test module (tests use unique names; label selectors keep them apart)."""
    stand_in = start_kube(tmp_path_factory.mktemp("kube"), args=FAST)
    yield stand_in
    stand_in.stop()


@pytest.fixture
def kube_factory(tmp_path: Path) -> Iterator[StartKube]:
    """`kube_factory(*extra_flags)` starts a fresh stand-in; all are stopped after the test."""
    started: list[KubeStandIn] = []

    def factory(*args: str) -> KubeStandIn:
        stand_in = start_kube(tmp_path / f"kube{len(started)}", args=(*FAST, *args))
        started.append(stand_in)
        return stand_in

    yield factory
    for stand_in in started:
        stand_in.stop()


@pytest.fixture
async def kr8s_api(kube: KubeStandIn) -> AsyncIterator[kr8s.asyncio.Api]:
    """A kr8s client of the shared stand-in, configured only by its kubeconfig file."""
    yield await kr8s.asyncio.api(kubeconfig=str(kube.kubeconfig_path))
