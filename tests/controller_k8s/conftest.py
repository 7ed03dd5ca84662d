"""Fixtures of the Kubernetes runner tests: one gateway, engine stand-in and Kubernetes stand-in for the
whole run, each test's leftovers failed afterwards. Helpers are in `k8s_support.py`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from k8s_support import AGENTS_DIR, GATEWAY_ARGS, KUBE_ARGS, TEMPLATE, K8sEnv, end_leftovers
from kube_standin import start_kube

from keraunos.testing.processes import start_engine, start_gateway


@pytest.fixture(scope="session")
def k8s_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sEnv]:
    """A gateway with the engine stand-in behind it, and a Kubernetes stand-in whose node runs the
    test agents (agents/ on its PYTHONPATH)."""
    base = tmp_path_factory.mktemp("controller-k8s")
    engine = start_engine(base / "engine")
    gateway = kube = None
    try:
        gateway = start_gateway(base / "gateway", args=GATEWAY_ARGS)
        gateway.register([engine])
        pythonpath = os.pathsep.join(p for p in (str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
        kube = start_kube(base / "kube", args=KUBE_ARGS, env={"PYTHONPATH": pythonpath})
        template_file = base / "job-template.yaml"
        template_file.write_text(TEMPLATE)
        yield K8sEnv(gateway, kube, base, template_file)
    finally:
        if kube is not None:
            kube.stop()
        if gateway is not None:
            gateway.stop()
        engine.kill()


@pytest.fixture
def k8s(k8s_session: K8sEnv) -> Iterator[K8sEnv]:
    """The shared environment for one test: faults it injected and rollouts it left are cleared after."""
    yield k8s_session
    k8s_session.kube.controls.clear_faults()
    end_leftovers(k8s_session.gateway)
