"""The one exception tree (keraunos/errors.py): the drawing in its docstring is the truth, and
every exception class keraunos defines is either in it or named as internal here."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import keraunos.errors as errors
from keraunos.errors import InputError, KeraunosError, exit_status

PACKAGE = Path(errors.__file__).resolve().parent

# Control-flow exceptions that never leave their module, and HTTP exceptions (answered by FastAPI).
INTERNAL = {
    "BodyTooLarge",  # gateway._limits: an HTTPException (413)
    "DialectRequestError",  # gateway.dialects.base: a body a dialect refuses, answered 4xx by the route
    "NotAcknowledged",  # gateway.replicas: a pause not yet acknowledged by every replica
    "_BatchFailed",  # serving.server: fails the requests of one batch
    "Gone",  # controller.runners._k8s_watch: a watch to restart
    "WarmUnavailable",  # controller.runners.warm: fall back to a cold start
    "StateDirBusy",  # controller.runners._state: turned into StartupError by main
    "CalcError",  # examples.calc: the example agent's own errors (user code)
    "TaskError",
}
_LINE = re.compile(r"^[│├└─ ]*(?P<name>[A-Z][A-Za-z]+)\s+(?P<module>[a-z0-9_.]+):")


def drawn() -> list[tuple[str, str, bool]]:
    """(class name, module, under InputError) for every class the docstring's tree names."""
    doc = errors.__doc__ or ""
    tree = doc.split("```")[1]
    out, under_input = [], False
    for line in tree.splitlines():
        if "InputError" in line and "├──" in line:
            under_input = True
        elif "(runtime failures)" in line:
            under_input = False
        match = _LINE.match(line)
        if match:
            module = match["module"].split(":")[0]
            out.append((match["name"], "keraunos." + module, under_input))
    return out


@pytest.mark.parametrize(("name", "module", "is_input"), drawn(), ids=[d[0] for d in drawn()])
def test_each_class_in_the_drawing_exists_on_its_branch(name: str, module: str, is_input: bool) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, KeraunosError)
    assert issubclass(cls, InputError) is is_input


def test_every_exception_class_in_the_package_is_in_the_tree_or_named_internal() -> None:
    # Every class name the drawing mentions, subclasses listed after a base's module included.
    named = set(re.findall(r"\b[A-Z][A-Za-z]+\b", (errors.__doc__ or "").split("```")[1]))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "testing"):  # test support, not the product
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            looks_like_an_error = node.name.endswith("Error") or any(
                b.endswith(("Error", "Exception")) for b in bases
            )
            if looks_like_an_error and node.name not in named | INTERNAL:
                missing.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}")
    assert missing == [], "add these to keraunos/errors.py's tree, or to INTERNAL here"


def test_the_cli_exit_status_is_two_for_bad_input_and_one_for_a_runtime_failure() -> None:
    from keraunos.ledger.errors import LedgerUnavailable
    from keraunos.serving.prompts import PromptError

    assert exit_status(PromptError("bad messages")) == 2
    assert exit_status(LedgerUnavailable("down")) == 1
    assert isinstance(PromptError("x"), ValueError)  # input errors stay ValueErrors for old callers
