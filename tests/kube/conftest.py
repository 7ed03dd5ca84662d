"""Fixtures of the Kubernetes stand-in's tests: a shared stand-in, fresh ones, and the runner's own
client of it (`keraunos.controller.runners._k8s_api.KubeApi` over kr8s), so the stand-in is tested
through exactly the calls keraunos makes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import kr8s.asyncio
import pytest
from kube_standin import KubeStandIn, start_kube
from kube_support import FAST

from keraunos.controller.runners._k8s_api import KubeApi

StartKube = Callable[..., KubeStandIn]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStandIn]:
    """One stand-in shared by these tests (they use unique names; label selectors keep them apart)."""
    stand_in = start_kube(tmp_path_factory.mktemp("kube"), args=(*FAST, "--bookmark-interval-seconds", "0.2"))
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
async def runner_api(kube: KubeStandIn) -> AsyncIterator[KubeApi]:
    """The runner's client of the shared stand-in, configured only by its kubeconfig file."""
    api = await kr8s.asyncio.api(kubeconfig=str(kube.kubeconfig_path))
    yield KubeApi(api, kube.namespace, timeout_s=10)
