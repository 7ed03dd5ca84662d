"""The processes a training run starts beside itself: the embedded gateway and the local
controller (`keraunos gateway`, `keraunos controller` as subprocesses), each with its log file;
each child stops when the run's process does, even when it is killed outright (keraunos._parent)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from keraunos._parent import parent_env
from keraunos._subprocess import free_port, stop_process
from keraunos.training.errors import TrainError
from keraunos.training.train_config import TrainConfig


@dataclass
class Child:
    """A subprocess the run started (gateway or controller), with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def check(self) -> None:
        """Raise `TrainError` (with the log's last line) if the process has exited."""
        code = self.process.poll()
        if code is not None:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "(empty log)"
            raise TrainError(f"the {self.name} exited with status {code}: {last} (log: {self.log_path})")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        stop_process(self.process, grace)


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment minus KERAUNOS_* (the run's own settings), with the working directory on
    PYTHONPATH so agent classes next to the user resolve in every process, and this process named
    as the parent the child stops with (`keraunos._parent`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    env.update(parent_env())
    env.update(extra or {})
    return env


def _flags(**options: object) -> list[str]:
    """`--name value` pairs of a keraunos command line (underscores become dashes)."""
    flags: list[str] = []
    for name, value in options.items():
        flags += ["--" + name.replace("_", "-"), repr(value) if isinstance(value, float) else str(value)]
    return flags


def _spawn(name: str, args: list[str], log_path: Path) -> Child:
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "keraunos.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
    return Child(name, process, log_path)


def start_gateway(config: TrainConfig, run_dir: Path, key: str) -> tuple[str, Child]:
    """Start `keraunos gateway` on a free loopback port with the run's ledger; (URL, child) once up."""
    logs = run_dir / "logs"
    last = ""
    for _ in range(3):  # the free port may be taken before the gateway binds it
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = _flags(
            host="127.0.0.1",
            port=port,
            key=key,
            db=run_dir / "ledger.db",
            served_model=config.served_model_name,
            train_temperature=config.temperature,
            log_level="warning",
        )
        child = _spawn(
            "gateway",
            ["gateway", *args],
            logs / "gateway.log",
        )
        deadline = time.monotonic() + config.startup_timeout_s
        while time.monotonic() < deadline and child.process.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    return url, child
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        child.stop()
        last = child.log_path.read_text(errors="replace")
        if "address already in use" not in last.lower():
            break
    lines = last.strip().splitlines()
    raise TrainError(
        f"the embedded gateway did not start: {lines[-1] if lines else 'no output'} "
        f"(log: {logs / 'gateway.log'})"
    )


def start_controller(config: TrainConfig, gateway: str, key: str, run_dir: Path) -> Child:
    """Start `keraunos controller` running the configured agent against `gateway`."""
    agent = {"agent_class": config.agent_class} if config.agent_class else {"command": config.agent_command}
    args = _flags(
        gateway=gateway,
        key=key,
        **agent,
        pool_size=config.pool_size,
        warm_workers=config.warm_workers,
        poll_interval_s=config.controller_poll_interval_s,
        state_dir=run_dir / "controller" / "state",
        log_dir=run_dir / "controller" / "agents",
        log_level="warning",
    )
    return _spawn(
        "controller",
        ["controller", *args],
        run_dir / "logs" / "controller.log",
    )
