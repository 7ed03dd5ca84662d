"""The sticky split of a canary: which arm a rollout is in, from its id alone.

A canary sends a share of new rollouts to the candidate. The arm must not depend on anything that
changes while the rollout lives (its attempts, a restart of the gateway, the order rollouts arrive
in), and the sample-ratio check (`keraunos.release.stats.SampleRatio`) must be able to trust that
each rollout went to the candidate with the planned share, independently of the others. So the arm
is a pure function of the release and the rollout id:

    point = first 8 bytes of sha256(release_id NUL rollout_id), as an integer / 2**64   (in [0, 1))
    arm   = candidate if point < share else baseline

- **Sticky**: the same rollout always gets the same arm, across attempts and processes.
- **Monotone across stages**: raising the share from 5 % to 25 % keeps every 5 % candidate rollout
  a candidate; only baseline rollouts move over.
- **Independent per release**: the release id salts the hash, so a rollout that was a candidate in
  one release is no likelier to be one in the next.
- Under sha256 the points of distinct ids behave as independent uniforms, which is what the
  sample-ratio martingale assumes; an assignment that is *not* made this way (a skewed router, a
  stale share) is what it catches.

Pure; nothing here does I/O.
"""

from __future__ import annotations

import hashlib

from keraunos.release.stats import Arm, check_fraction

_SCALE = float(2**64)


def split_point(release_id: str, rollout_id: str) -> float:
    """The rollout's fixed uniform point in [0, 1) for this release."""
    digest = hashlib.sha256(release_id.encode() + b"\0" + rollout_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def arm_of(release_id: str, rollout_id: str, candidate_share: float) -> Arm:
    """The arm of `rollout_id` in release `release_id` while the candidate's share is `candidate_share`.

    The share must be strictly between 0 and 1 (`ObservationError` otherwise): a stage of 0 % or
    100 % is not a split, and the release sends every rollout to one version without asking.
    """
    share = check_fraction(candidate_share)
    return "candidate" if split_point(release_id, rollout_id) < share else "baseline"
