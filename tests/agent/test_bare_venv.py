"""The agent SDK in a virtual environment holding only httpx, as an agent image installs it.

An agent image runs `pip install --no-deps keraunos httpx` (httpx's own dependencies included).
Here pip installs into a fresh `python -m venv`, from wheels made on the spot (no network): httpx
and its dependency closure repacked from this environment's installed distributions, and keraunos
packed from its source tree, all with `--no-deps`. Nothing else is in the venv, so an SDK import
of pydantic, numpy or any other keraunos dependency fails there instead of passing unnoticed. An agent script then runs in that venv inside a rollout of a real gateway.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import keraunos
from keraunos.testing.processes import Gateway
from keraunos.training._read import read_events

AgentEnviron = Callable[..., dict[str, str]]

#: What an agent's environment must not have: keraunos' own dependencies beyond httpx.
NOT_INSTALLED = ("pydantic", "numpy", "fastapi", "orjson", "structlog", "typer", "yaml", "uvicorn", "torch")


def dependency_closure(name: str) -> list[str]:
    """`name` and every distribution it requires in this interpreter (extras off, markers evaluated)."""
    found: dict[str, None] = {}
    pending = [name]
    while pending:
        dist = importlib.metadata.distribution(pending.pop())
        key = dist.metadata["Name"]
        if key in found:
            continue
        found[key] = None
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found)


def write_wheel(wheel: Path, files: dict[str, bytes], metadata_dir: str) -> Path:
    """A wheel archive holding `files` (archive path -> content) and a RECORD of them."""
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        records.append(f"{metadata_dir}/RECORD,,")
        archive.writestr(f"{metadata_dir}/RECORD", "\n".join(records) + "\n")
    return wheel


def wheel_from_installed(name: str, wheelhouse: Path) -> Path:
    """A pure-Python wheel of the installed distribution `name`: its files as pip installed them."""
    dist = importlib.metadata.distribution(name)
    files = {
        file.as_posix(): Path(str(dist.locate_file(file))).read_bytes()
        for file in dist.files or ()
        # Scripts outside site-packages, byte code and the installer's own records are not wheel parts.
        if file.parts[0] != ".."
        and "__pycache__" not in file.parts
        and file.name not in ("RECORD", "INSTALLER")
    }
    metadata_dir = next(name.split("/")[0] for name in files if name.split("/")[0].endswith(".dist-info"))
    stem = dist.metadata["Name"].replace("-", "_")
    return write_wheel(wheelhouse / f"{stem}-{dist.version}-py3-none-any.whl", files, metadata_dir)


def wheel_of_keraunos(wheelhouse: Path) -> Path:
    """keraunos packed from its source tree: every file of the package, the name and version as metadata.

    Packed here rather than built with setuptools, which a test environment need not have; its
    dependencies are not listed, as `pip install --no-deps` would ignore them anyway.
    """
    package = Path(keraunos.__file__).resolve().parent
    files = {
        f"keraunos/{path.relative_to(package).as_posix()}": path.read_bytes()
        for path in sorted(package.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }
    info = f"keraunos-{keraunos.__version__}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: keraunos\nVersion: {keraunos.__version__}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: keraunos-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    return write_wheel(wheelhouse / f"keraunos-{keraunos.__version__}-py3-none-any.whl", files, info)


def run(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{args}: {result.stderr[-2000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv where pip installed httpx, its dependencies and keraunos (with
    --no-deps), from local wheels only."""
    base = tmp_path_factory.mktemp("bare-venv")
    wheelhouse = base / "wheels"
    wheelhouse.mkdir()
    for name in dependency_closure("httpx"):
        wheel_from_installed(name, wheelhouse)
    wheel_of_keraunos(wheelhouse)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input")

    venv = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    # This environment's pip installs into the venv (--python), so the venv itself gets no pip; the
    # wheels are httpx's dependency closure and keraunos, each installed without its dependencies.
    run(*pip, "--python", python, "install", "--no-index", "--no-deps", *wheelhouse.iterdir(), timeout=120)
    return python


def bare_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: no PYTHONPATH, no KERAUNOS_* or AGL_* from the caller."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), **(extra or {})}


def test_the_bare_venv_has_httpx_and_keraunos_and_none_of_keraunos_other_dependencies(
    bare_python: Path,
) -> None:
    probe = (
        "import importlib.metadata, importlib.util, json, sys\n"
        "names = sorted(d.metadata['Name'].lower() for d in importlib.metadata.distributions())\n"
        "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
        "print(json.dumps({'installed': names, 'missing': missing}))"
    )
    report = json.loads(run(bare_python, "-c", probe, *NOT_INSTALLED, env=bare_env()))
    assert "httpx" in report["installed"] and "keraunos" in report["installed"]
    assert set(report["installed"]) == {n.lower() for n in dependency_closure("httpx")} | {"keraunos"}
    assert report["missing"] == list(NOT_INSTALLED)


AGENT = """
import json, sys
from keraunos.agent import api_key, attempt_id, emit_event, emit_reward, in_rollout, openai_base_url, rollout_id

emit_event("tool_call", {"name": "calc", "expression": "6*7"})
emit_reward(0.25, reason="intermediate")
stored = emit_reward(1.0, reason="exact answer")
third_party = sorted(
    {name.split(".")[0] for name in sys.modules} - set(sys.stdlib_module_names) - {"__main__"}
)
print(json.dumps({
    "base_url": openai_base_url(), "rollout_id": rollout_id(), "attempt_id": attempt_id(),
    "key": api_key(), "in_rollout": in_rollout(), "stored": stored, "modules": third_party,
}))
"""


def test_an_agent_in_the_bare_venv_posts_events_and_rewards_the_last_of_which_is_final(
    bare_python: Path, gateway: Gateway, agent_environ: AgentEnviron
) -> None:
    environ = agent_environ(attempt_id="0")
    rollout = environ["AGL_EVENT_URL"].split("/")[-4]
    report = json.loads(run(bare_python, "-c", AGENT, env=bare_env(environ)))

    assert report["base_url"] == environ["AGL_OPENAI_BASE_URL"] == gateway.proxy_base(rollout, "0")
    assert (report["rollout_id"], report["attempt_id"]) == (rollout, "0")
    assert report["key"] == environ["AGL_KEY"] and report["in_rollout"] is True
    assert report["stored"]["rollout_id"] == rollout and report["stored"]["data"]["value"] == 1.0
    # Only httpx, its own dependencies and keraunos itself were imported.
    allowed = {"httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio", "typing_extensions"}
    assert set(report["modules"]) <= allowed | {"keraunos"}, report["modules"]

    with gateway.client() as api:
        events = api.get(f"/api/rollouts/{rollout}/events").json()
        triplet = api.get(f"/api/rollouts/{rollout}/events", params={"format": "triplet"}).json()
    assert [(e["event_type"], e["data"]) for e in events] == [
        ("tool_call", {"name": "calc", "expression": "6*7"}),
        ("reward", {"value": 0.25, "reason": "intermediate"}),
        ("reward", {"value": 1.0, "reason": "exact answer"}),
    ]
    assert {e["attempt_id"] for e in events} == {"0"}
    # Both rewards are kept as events; the trainer's reading takes the last as the rollout's reward.
    assert read_events(triplet).reward == 1.0


def test_outside_a_rollout_the_sdk_says_so_in_one_clear_error(bare_python: Path) -> None:
    script = (
        "from keraunos.agent import NotInRolloutError, emit_reward, in_rollout\n"
        "assert not in_rollout()\n"
        "try:\n"
        "    emit_reward(1.0)\n"
        "except NotInRolloutError as error:\n"
        "    print(error)\n"
    )
    message = run(bare_python, "-c", script, env=bare_env()).strip()
    assert message == (
        "not running inside a rollout: AGL_OPENAI_BASE_URL, AGL_EVENT_URL, AGL_KEY not set (a keraunos "
        "or Agent Lightning runner sets them; to run an agent by hand, export them yourself)"
    )
