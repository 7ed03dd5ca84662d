"""Fixtures of the proxy tests: engine stand-ins (`keraunos engine-mock`) and gateways proxying to them.

Everything runs as real processes on loopback ports: the gateway exactly as a user starts it, the
model server as the vLLM stand-in of `keraunos.testing.engine`, steered over its `/mock` API.
Helpers live in `proxy_support.py`.
"""

from __future__ import annotations

from typing import Any

import pytest
from proxy_support import FAST_PROXY_ARGS, register

from keraunos.testing.processes import Engine, Gateway


@pytest.fixture(scope="module")
def proxy_gateway(session_gateway_factory: Any, engine: Engine) -> Gateway:
    """A gateway with fast retries whose served model is served by `engine`."""
    gateway = session_gateway_factory(args=FAST_PROXY_ARGS)
    register(gateway, [engine])
    return gateway
