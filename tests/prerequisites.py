"""What a test does when something it needs outside Python is missing (Agent Lightning 1.0.2's
venv, PostgreSQL's binaries): locally it skips and says why; in CI (`CI=true`) it fails, so the
evidence those tests give can never be skipped silently."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    """True in CI (`CI=true`, as CI services and `.ci/run`'s caller set it)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(reason: str) -> NoReturn:
    """Skip the test with `reason`, or fail it with `reason` in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails the run instead of skipping)")
    pytest.skip(reason)


def agl_binary(name: str) -> Path:
    """`bin/NAME` (`agl-server`, `agl-controller`) of the Agent Lightning 1.0.2 venv
    (`$KERAUNOS_TEST_AGL_VENV`, default `.venv-agl` at the repository's root, which `.ci/run`
    creates); `missing` when it is not installed there."""
    venv = Path(os.environ.get("KERAUNOS_TEST_AGL_VENV", REPO / ".venv-agl"))
    binary = venv / "bin" / name
    if not binary.exists():
        missing(
            f"Agent Lightning 1.0.2 is not installed in {venv} (install it with: python3 -m venv {venv} && "
            f"{venv}/bin/pip install --ignore-requires-python agentlightning==1.0.2)"
        )
    return binary
