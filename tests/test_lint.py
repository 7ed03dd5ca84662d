"""The code base stays clean: ruff (lint and format) and pyright pass, as STYLE.md asks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: install the project with its 'dev' extra")
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_lint_passes() -> None:
    result = _run(_tool("ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    result = _run(_tool("ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_pyright_passes() -> None:
    # The package, and the Kubernetes stand-in (a test double, but one with its own logic).
    result = _run(_tool("pyright"), "--pythonpath", sys.executable, "keraunos", "tests/kube_standin")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_two_test_modules_share_a_file_name() -> None:
    """Test directories have no `__init__.py`, so pytest imports each test module by its bare
    name: two `test_x.py` in different folders stop the whole run at collection."""
    tests = Path(__file__).resolve().parent
    names: dict[str, list[str]] = {}
    for path in tests.rglob("*.py"):
        in_package = (path.parent / "__init__.py").exists()  # imported by its dotted name
        if path.name != "conftest.py" and not in_package and ".venv" not in path.parts:
            names.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
