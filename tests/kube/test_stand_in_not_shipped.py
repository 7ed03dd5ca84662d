"""The Kubernetes API stand-in is a test double: it lives in tests/kube_standin/, never in the package.

(The wheel takes `keraunos*` only, so a module that is not under keraunos/ cannot ship in it.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import kube_standin

PACKAGE = Path(__file__).resolve().parents[2] / "keraunos"


def test_the_package_has_no_kubernetes_stand_in_module() -> None:
    assert importlib.util.find_spec("keraunos.testing.kube") is None
    assert PACKAGE not in Path(kube_standin.__file__).resolve().parents


def test_no_module_of_the_package_imports_the_stand_in() -> None:
    mentions = [
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "kube_standin" in path.read_text(encoding="utf-8")
    ]

    assert mentions == []
