"""Fixtures of the example agents' tests.

The examples live in the repository's `examples/` folder, outside the installed package: the
repository root goes on `sys.path` here (and on the agents' PYTHONPATH), as it is for a user who
runs them from a checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
