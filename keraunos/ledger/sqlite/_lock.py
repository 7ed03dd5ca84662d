"""The sidecar lock file that keeps two gateways off one SQLite ledger.

An exclusive, non-blocking `flock` on `<db>.lock`. The kernel drops it when the holder exits, even
on `kill -9`, so a crash never leaves a stale lock behind. The holder writes its pid into the file
so that the refusal can name it. `flock` locks belong to an open file description, so a second
ledger in the same process is refused as well.
"""

from __future__ import annotations

import errno
import fcntl
import os

from keraunos.ledger.errors import LedgerError, LedgerLocked


class FileLock:
    """Holds `<db>.lock` exclusively between `acquire()` and `release()`."""

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path = db_path + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise `LedgerLocked` naming the file and, if known, the holder's pid."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise LedgerError(f"ledger {self.db_path}: cannot open lock file {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LedgerError(f"ledger {self.db_path}: cannot lock {self.path}: {exc}") from exc
            by = f" (pid {holder})" if holder is not None else ""
            raise LedgerLocked(
                f"ledger {self.db_path} is in use by another keraunos gateway{by}; "
                "stop it or pass a different --db"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: deleting it would race with a process about to lock it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
