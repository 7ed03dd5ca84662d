"""A warm worker: `python -m keraunos.controller._warm_main`, a fork server for Python agent classes.

It reads one JSON request per line on stdin, `{"id", "agent_class", "env", "cwd", "log_path"}`,
imports the agent class in itself (once per class: the expensive part, e.g. `openai` costs about
a second of CPU), then forks. The child starts a new session (its own process group, as a cold
agent has), replaces its whole environment with `env`, changes to `cwd`, sends stdout and stderr
to `log_path` and runs the agent like `_agent_main` does, then exits without running any of the
worker's cleanup. The worker answers on stdout, one JSON line each: `{"id", "event": "started",
"pid"}` (once the child has its own session, so its group can be signalled), `{"id", "event":
"exited", "status"}` (status as `Popen.returncode`: negative for a
signal), or `{"id", "event": "failed", "error"}` when the class cannot be loaded. It exits when
stdin closes. Only the standard library is imported besides the agents.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from typing import Any, TextIO

from keraunos.controller._agent_main import AgentLoadError, load_agent_class, run_agent

#: How often the worker reaps finished children while no request arrives.
_REAP_INTERVAL_S = 0.02


def _send(out: TextIO, **message: Any) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _child(request: dict[str, Any], channel: TextIO, ready_fd: int) -> int:
    """In the forked child: become an isolated agent process and run the agent; the exit status."""
    os.setsid()
    os.close(ready_fd)  # tells the worker the process group exists, so it can be signalled
    os.close(channel.fileno())  # the worker's answers are not the agent's to write
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    log_fd = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.close(null_fd)
    # Fresh text streams over the redirected descriptors (the worker's buffers are not ours).
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        return run_agent(request["agent_class"])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(requests: TextIO, out: TextIO) -> None:
    """Fork one agent process per request until `requests` closes; report starts and exits on `out`."""
    running: dict[int, str] = {}
    buffered = ""
    fd = requests.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], _REAP_INTERVAL_S)
        if ready:
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                return
            buffered += chunk
            *lines, buffered = buffered.split("\n")
            for line in lines:
                if line.strip():
                    _start(json.loads(line), running, out)
        _reap(running, out)


def _start(request: dict[str, Any], running: dict[int, str], out: TextIO) -> None:
    try:
        load_agent_class(request["agent_class"])  # imported here, so every fork finds it loaded
    except AgentLoadError as exc:
        _send(out, id=request["id"], event="failed", error=str(exc))
        return
    out.flush()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_read)
        status = 1
        try:
            status = _child(request, out, ready_write)
        except SystemExit as exc:  # as a cold agent's interpreter would exit
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(ready_write)
    os.read(ready_read, 1)  # end of file once the child has its own session (or has died)
    os.close(ready_read)
    running[pid] = request["id"]
    _send(out, id=request["id"], event="started", pid=pid)


def _reap(running: dict[int, str], out: TextIO) -> None:
    while running:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        request_id = running.pop(pid, None)
        if request_id is not None:
            _send(out, id=request_id, event="exited", status=_returncode(wait_status))


def _returncode(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def main() -> None:
    """Answer on a private copy of stdout; what agent modules print while imported goes to stderr."""
    # SIGINT from a terminal goes to the controller, which stops the agents itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(sys.stdin, channel)


if __name__ == "__main__":
    main()
