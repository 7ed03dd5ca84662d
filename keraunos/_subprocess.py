"""Child processes the way every keraunos command and test stops them: SIGTERM, grace, SIGKILL."""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen[bytes], grace: float) -> int | None:
    """SIGTERM, then SIGKILL if it has not exited after `grace` seconds; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """`kill -9` (no chance to flush or close anything), then reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(5)
