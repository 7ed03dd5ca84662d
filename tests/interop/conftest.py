"""Where the Agent Lightning 1.0.2 reference installation lives (a separate venv, made by `.ci/run`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def agl_venv() -> Path:
    """The venv holding agentlightning 1.0.2 (`$KERAUNOS_TEST_AGL_VENV`, default `.venv-agl`).

    `.ci/run` creates it with `pip install --ignore-requires-python agentlightning==1.0.2`; the
    interop tests skip, saying why, only when that installation is not there.
    """
    venv = Path(os.environ.get("KERAUNOS_TEST_AGL_VENV", REPO / ".venv-agl"))
    if not (venv / "bin" / "agl-controller").exists():
        pytest.skip(
            f"Agent Lightning 1.0.2 is not installed in {venv} (install it with: python3 -m venv {venv} && "
            f"{venv}/bin/pip install --ignore-requires-python agentlightning==1.0.2)"
        )
    return venv
