"""Fixtures of the re-reward tests: a gateway of the module's own, proxying to the engine stand-in."""

from __future__ import annotations

from typing import Any

import pytest

from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway


@pytest.fixture(scope="module")
def stack(session_gateway_factory: Any, engine: Engine) -> Gateway:
    """A gateway of the module's own whose served model is the engine stand-in."""
    gateway = session_gateway_factory(args=("--served-model", SERVED_MODEL))
    gateway.register([engine], version=1)
    return gateway
