"""Stop with the parent: a gateway or controller that `keraunos train` started ends when it does.

`keraunos train` (and `keraunos demo`) start the gateway and the controller as child processes and
stop them on the way out. A parent killed outright (`kill -9`, the kernel's out-of-memory killer)
cannot: its children would keep the port, the ledger file and the agents. So the parent names its
process id in the child's environment (`parent_env`), and the child runs `watch_parent`: a daemon
thread that sends its own process SIGTERM once its parent is no longer that process, so the child
stops the way it always does on SIGTERM (the gateway drains its calls and closes the ledger; the
controller stops its agents).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping

#: The environment variable holding the parent's process id.
PARENT_PID = "KERAUNOS_EXIT_WITH_PARENT"


def parent_env() -> dict[str, str]:
    """The environment entry that makes a child started by this process stop when this process ends."""
    return {PARENT_PID: str(os.getpid())}


def watch_parent(environ: Mapping[str, str], *, interval_s: float = 0.2) -> threading.Thread | None:
    """If `environ` names a parent (`PARENT_PID`), a started daemon thread that sends this process
    SIGTERM, once, as soon as its parent is another process (the named one died and this one was
    re-parented); None when no parent is named. Raises ValueError for a value that is no process id.
    """
    value = environ.get(PARENT_PID, "").strip()
    if not value:
        return None
    # Process id 1 is a valid parent: `keraunos train` as a container's entry point.
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{PARENT_PID} must be the parent's process id, got {value!r}")
    parent = int(value)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread
