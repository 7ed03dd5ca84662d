"""A real PostgreSQL server for tests and benchmarks: a private cluster on a free loopback port.

`start_postgres()` runs `initdb` in a temporary directory and starts `postgres` on 127.0.0.1 with
trust authentication, fsync on (durability is part of what the ledger tests check), and no Unix
socket. As root the server runs as the `postgres` system user (PostgreSQL refuses to run as root);
otherwise as the current user. The server is stopped, and its directory removed, by `stop()`, at
interpreter exit, or by the kernel when the starting process dies (parent-death signal).

`create_database()` gives each test a database of its own on a shared server, so tests never see
each other's rows. No test framework is imported here; fixtures wrap these.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from keraunos._subprocess import free_port

#: Where Debian/Ubuntu install the PostgreSQL 15 server binaries; `KERAUNOS_PG_BIN` overrides it.
DEFAULT_PG_BIN = Path("/usr/lib/postgresql/15/bin")

#: System user the server runs as when the caller is root.
SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries (or, as root, the `postgres` user) are not on this machine."""


def pg_bin_dir() -> Path:
    """Directory of `initdb` and `postgres`: `$KERAUNOS_PG_BIN`, or the Debian PostgreSQL 15 path."""
    return Path(os.environ.get("KERAUNOS_PG_BIN", str(DEFAULT_PG_BIN)))


def postgres_missing() -> str | None:
    """Why a server cannot be started here (a reason to skip a test), or None when it can."""
    bin_dir = pg_bin_dir()
    for name in ("initdb", "postgres"):
        if not os.access(bin_dir / name, os.X_OK):
            return f"PostgreSQL server binaries not found: {bin_dir / name} (set KERAUNOS_PG_BIN)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run PostgreSQL as"
    return None


@dataclass
class PostgresServer:
    """A running PostgreSQL server: `dsn` reaches its `postgres` database as the superuser."""

    dsn: str
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    _cleanup: Callable[[], None] = field(repr=False, default=lambda: None)

    def dsn_for(self, database: str) -> str:
        """The DSN of another database on this server."""
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "t", *, template: str | None = None) -> str:
        """Create a database `<prefix>_<random>` and return its DSN.

        It is empty, or a copy of the database `template` (which nobody may be connected to).
        """
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        sql = f'CREATE DATABASE "{name}"'
        if template is not None:
            sql += f' TEMPLATE "{template}"'
        deadline = time.monotonic() + 10
        while True:
            try:
                self.execute(sql)
                return self.dsn_for(name)
            except asyncpg.ObjectInUseError:
                # The template's last client has disconnected, but its backend has not exited yet.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one SQL statement as the superuser (safe to call from inside an event loop)."""
        _run_in_thread(_execute(self.dsn_for(database), sql))

    def log(self) -> str:
        """The server's log so far."""
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        """Whether the server process is still alive."""
        return self.process.poll() is None

    def kill(self) -> None:
        """Stop at once, as a crash would (SIGKILL to the server and its backends); the data stays."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        _wait_for_group(self.process.pid)

    def restart(self, ready_timeout: float = 60.0) -> None:
        """Start the server again on the same data directory and port (after `kill()`)."""
        self.kill()
        self.process = _spawn(self.data_dir, self.port, self.log_path)
        _wait_ready(self, ready_timeout)

    def stop(self) -> None:
        """Stop at once and remove the data directory (nothing of it is kept, so no shutdown
        checkpoint is waited for). Safe to call twice."""
        self._cleanup()


def start_postgres(
    *,
    base_dir: Path | None = None,
    fsync: bool = True,
    settings: Sequence[tuple[str, str]] = (),
    ready_timeout: float = 60.0,
) -> PostgresServer:
    """Initialise a fresh cluster and start it on a free 127.0.0.1 port; ready when this returns.

    `base_dir` defaults to a new directory under the system temp dir (a pytest tmp_path is not
    readable by the `postgres` user when running as root). `settings` are extra `-c name=value`
    server settings. Raises `PostgresUnavailable` when the binaries are missing.
    """
    reason = postgres_missing()
    if reason is not None:
        raise PostgresUnavailable(reason)
    root = Path(tempfile.mkdtemp(prefix="keraunos-pg-", dir=base_dir))
    data_dir = root / "data"
    log_path = root / "postgres.log"
    owner = _server_owner()
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    _initdb(data_dir, log_path)
    conf = [("fsync", "on" if fsync else "off"), *settings]
    with (data_dir / "postgresql.conf").open("a") as handle:
        handle.writelines(f"{name} = '{value}'\n" for name, value in conf)
    last_error = ""
    for _ in range(3):  # the port can be taken between free_port() and the server's bind
        port = free_port()
        process = _spawn(data_dir, port, log_path)
        server = PostgresServer(
            dsn=f"postgresql://{SERVER_USER}@127.0.0.1:{port}/postgres",
            port=port,
            data_dir=data_dir,
            process=process,
            log_path=log_path,
        )
        try:
            _wait_ready(server, ready_timeout)
        except RuntimeError as exc:
            server.kill()
            last_error = str(exc)
            if "could not bind" in last_error or "already in use" in last_error:
                continue
            break
        cleanup = _cleanup_once(server, root)
        server._cleanup = cleanup
        atexit.register(cleanup)
        return server
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start:\n{last_error}")


def _server_owner() -> pwd.struct_passwd | None:
    """The user to run the server as (root cannot), or None to run as ourselves."""
    return pwd.getpwnam(SERVER_USER) if os.geteuid() == 0 else None


def _as_server_user() -> tuple[int | None, int | None, list[int] | None]:
    """(user, group, extra_groups) for subprocess: the server user as root, else all None."""
    owner = _server_owner()
    if owner is None:
        return None, None, None
    return owner.pw_uid, owner.pw_gid, []


def _initdb(data_dir: Path, log_path: Path) -> None:
    cmd = [
        str(pg_bin_dir() / "initdb"),
        "--pgdata",
        str(data_dir),
        "--username",
        SERVER_USER,
        "--auth",
        "trust",
        "--encoding",
        "UTF8",
        "--locale",
        "C",
        "--no-sync",  # the cluster is fresh: only what the server writes later must be durable
    ]
    user, group, extra_groups = _as_server_user()
    with log_path.open("ab") as log:
        result = subprocess.run(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_server_env(),
            check=False,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )
    if result.returncode != 0:
        raise RuntimeError(f"initdb failed ({result.returncode}):\n{log_path.read_text(errors='replace')}")


def _server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _die_with_parent() -> Callable[[], None]:
    """What the child runs before exec: the kernel sends it SIGQUIT (immediate shutdown) when we die.

    libc is looked up here, in the parent: a dlopen between fork and exec could deadlock."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def in_child() -> None:
        prctl(pr_set_pdeathsig, signal.SIGQUIT)

    return in_child


def _spawn(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [
        str(pg_bin_dir() / "postgres"),
        "-D",
        str(data_dir),
        "-p",
        str(port),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=200",
    ]
    user, group, extra_groups = _as_server_user()
    with log_path.open("ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_server_env(),
            preexec_fn=_die_with_parent(),
            start_new_session=True,  # its own process group: kill() takes the backends too
            user=user,
            group=group,
            extra_groups=extra_groups,
        )


def _wait_ready(server: PostgresServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"postgres exited with {server.process.returncode}:\n{server.log()}")
        try:
            server.execute("SELECT 1")
            return
        except (TimeoutError, OSError, asyncpg.PostgresError):
            time.sleep(0.05)
    raise RuntimeError(f"postgres did not accept connections within {timeout:g} s:\n{server.log()}")


def _wait_for_group(pgid: int) -> None:
    """Wait until no process of the server's group is left running (a restart needs its shared
    memory free). Zombies do not count: in a container nobody may ever reap them."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _group_running(pgid):
        time.sleep(0.02)


def _group_running(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


def _cleanup_once(server: PostgresServer, root: Path) -> Callable[[], None]:
    done = threading.Event()

    def cleanup() -> None:
        if done.is_set():
            return
        done.set()
        server.kill()
        shutil.rmtree(root, ignore_errors=True)

    return cleanup


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute(sql, timeout=30)
    finally:
        await conn.close()


def _run_in_thread(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion on a private loop in another thread, re-raising its error."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="keraunos-pg-sql")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
