"""`TrainError`: a training run cannot go on (raised by the loop, its process stack and its registry)."""

from __future__ import annotations

from keraunos.errors import KeraunosError


class TrainError(KeraunosError):
    """The run cannot go on; the message says why in one line (and where the logs are)."""
