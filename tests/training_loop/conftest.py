"""Fixtures of the training-loop tests: test agents on the agents' PYTHONPATH, a runner for
`keraunos train` in a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

AGENTS_DIR = Path(__file__).resolve().parent / "agents"


@pytest.fixture
def agents_pythonpath() -> str:
    """PYTHONPATH that makes the test agents importable (`digits_agent:DigitsAgent`)."""
    return os.pathsep.join(p for p in (str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the loop's own event loop)."""
    return "asyncio"
