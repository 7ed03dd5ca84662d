"""Where the Agent Lightning 1.0.2 reference installation lives (a separate venv, made by `.ci/run`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prerequisites import agl_binary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def agl_venv() -> Path:
    """The venv holding agentlightning 1.0.2 (`$KERAUNOS_TEST_AGL_VENV`, default `.venv-agl`).

    `.ci/run` creates it with `pip install --ignore-requires-python agentlightning==1.0.2`; the
    interop tests skip, saying why, only when that installation is not there (and fail in CI).
    """
    return agl_binary("agl-controller").parents[1]
