"""The processes a training run starts beside itself: the embedded gateway and the local
controller (`keraunos gateway`, `keraunos controller` as subprocesses), and the engine replicas of
`serving: endpoints` with `engine_replicas` (`keraunos serve`, or the user's vLLM command line),
each with its log file. Each child stops when the run's process does, even when it is killed
outright: keraunos's own through keraunos._parent, engine replicas (which may be any program)
through the kernel's parent-death signal on Linux."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
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
            exact_tokens=config.exact_tokens,
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


#: The placeholders an `engine_command` may hold, and what `start_engines` puts in for them.
ENGINE_PLACEHOLDERS = ("{port}", "{model}", "{served_model_name}")


@dataclass
class EngineChild:
    """An engine replica the run started: its OpenAI base URL (with /v1) and its process."""

    endpoint: str
    child: Child


def engine_argv(config: TrainConfig, port: int, device: str = "cpu") -> list[str]:
    """The command line of one replica on `port`: `engine_command` with its placeholders put in
    (each argument separately, so braces elsewhere, as in a JSON option, stay as they are), or
    `keraunos serve` of the run's model under its served name, on `device`."""
    if not config.engine_command:
        return [
            sys.executable,
            "-m",
            "keraunos.cli",
            "serve",
            *_flags(
                model=config.model,
                host="127.0.0.1",
                port=port,
                served_model_name=config.served_model_name,
                device=device,
                max_batch_size=config.max_batch_size,
                batch_wait_ms=config.batch_wait_ms,
                seed=config.seed,
                torch_threads=config.torch_threads,
                log_level="warning",
            ),
        ]
    values = {"{port}": str(port), "{model}": config.model, "{served_model_name}": config.served_model_name}
    argv = []
    for arg in shlex.split(config.engine_command):
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        argv.append(arg)
    return argv


def start_engines(config: TrainConfig, run_dir: Path, device: str = "cpu") -> list[EngineChild]:
    """Start `engine_replicas` replicas on free loopback ports, without waiting for them (they load
    while the trainer does); `wait_for_engines` waits. vLLM replicas get VLLM_SERVER_DEV_MODE=1,
    which opens the routes its weights are reloaded through, and VLLM_ALLOW_RUNTIME_LORA_UPDATING
    (its adapter load routes; the command still needs --enable-lora)."""
    if config.engine_command and "{port}" not in config.engine_command:
        raise TrainError("engine_command must hold {port}: each replica listens on a port the run picks")
    extra = (
        {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        if config.engine_kind == "vllm"
        else {}
    )
    started: list[EngineChild] = []
    for index in range(config.engine_replicas):
        port = free_port()
        log_path = run_dir / "logs" / f"engine-{index}.log"
        with log_path.open("ab") as out:
            try:
                process = subprocess.Popen(
                    engine_argv(config, port, device),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=_child_env(extra),
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                for engine in started:
                    engine.child.stop()
                raise TrainError(f"cannot start engine replica {index}: {exc}") from None
        started.append(
            EngineChild(f"http://127.0.0.1:{port}/v1", Child(f"engine replica {index}", process, log_path))
        )
    return started


def wait_for_engines(engines: list[EngineChild], timeout_s: float) -> None:
    """Wait until every replica answers GET /health with 200; `TrainError` naming the first that
    exited or did not answer within `timeout_s` (with its log's last line)."""
    deadline = time.monotonic() + timeout_s
    for engine in engines:
        root = engine.endpoint.removesuffix("/v1")
        while True:
            engine.child.check()
            try:
                if httpx.get(f"{root}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TrainError(
                    f"the {engine.child.name} ({root}) did not answer /health within {timeout_s:.0f}s "
                    f"(log: {engine.child.log_path})"
                )
            time.sleep(0.2)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before it runs the engine: SIGTERM it when the process that started it dies
    (Linux; a no-op elsewhere). Engines are other programs, so keraunos._parent cannot watch for
    them. The run starts them from its main thread, whose end is the process's end."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
