"""Confidence sequences for means in [0, 1], and the sample-ratio martingale: the statistics under
`keraunos.release.stats`' decisions, pure and vectorised over many streams at once.

The CS for a mean of values in [0, 1] is the predictable plug-in empirical-Bernstein CS of
Waudby-Smith & Ramdas (2023, "Estimating means of bounded random variables by betting", JRSSB,
Theorem 2). With mu_{t-1} = (1/2 + sum x) / t and s2_{t-1} = (1/4 + sum (x_i - mu_i)^2) / t,
each observation gets a predictable bet
`lambda_t = min(sqrt(2 log(2/alpha) / (s2_{t-1} t log(1 + t))), max_bet)` and a penalty
`p_t = (x_t - mu_{t-1})^2 (-log(1 - lambda_t) - lambda_t)`; then

    C_t = sum(lambda x) / sum(lambda)  +-  (log(2/alpha) + sum(p)) / sum(lambda)

because `exp(sum lambda_i (x_i - m) - sum p_i)` is a nonnegative supermartingale for the true mean
m (Fan et al. 2015's inequality), and Ville's inequality bounds the chance it ever crosses 2/alpha.
The interval adapts to the variance (an error rate of 2 % gets a far narrower CS than a coin-flip
reward), is clipped to [0, 1] and intersected over time (valid, since the coverage is uniform).

The sample-ratio test: under the planned split each assignment is Bernoulli(p_t) with a known
p_t; a mixture over a grid of log-odds tilts of the likelihood ratios is a nonnegative martingale
with mean 1 (`sample_ratio_log_evidence`), so it passes 1/alpha with probability <= alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from keraunos.errors import InputError

#: Log-odds tilts the sample-ratio mixture bets on, both directions (a 5 % split observed as 6 % is
#: a tilt of about 0.19): small tilts catch slight skews late, large ones gross skews early.
SRM_TILTS: tuple[float, ...] = tuple(s * 2.0**k for k in range(-5, 2) for s in (1.0, -1.0))


class ObservationError(InputError):
    """A reward, arm, fraction or latency the release statistics cannot take (NaN, unknown arm, ...)."""


# --- the confidence sequence, for whole arrays of streams -------------------------------------------


def confidence_sequence(x: np.ndarray, alpha: float, max_bet: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of the mean after each observation: x is (..., n) in [0, 1], both are (..., n).

    The predictable plug-in empirical-Bernstein CS (see the module docstring), running-intersected
    and clipped to [0, 1]. Every stream of the leading axes is independent; this is what the
    simulation runs over thousands of releases, and `BoundedMean.add` is its one-step form.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        return x.copy(), x.copy()
    if not bool(np.isfinite(x).all()) or bool((x < 0).any()) or bool((x > 1).any()):
        raise ObservationError(
            "confidence_sequence needs finite values in [0, 1] (clip rewards with clip_rewards first)"
        )
    log_term = math.log(2 / alpha)
    t = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    mean = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)
    mean_before = np.concatenate([np.full((*x.shape[:-1], 1), 0.5), mean[..., :-1]], axis=-1)
    var = (0.25 + np.cumsum((x - mean) ** 2, axis=-1)) / (t + 1)
    var_before = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), var[..., :-1]], axis=-1)
    bet = np.minimum(np.sqrt(2 * log_term / (var_before * t * np.log1p(t))), max_bet)
    penalty = (x - mean_before) ** 2 * (-np.log1p(-bet) - bet)
    bets = np.cumsum(bet, axis=-1)
    centre = np.cumsum(bet * x, axis=-1) / bets
    radius = (log_term + np.cumsum(penalty, axis=-1)) / bets
    lower = np.maximum.accumulate(np.clip(centre - radius, 0.0, 1.0), axis=-1)
    upper = np.minimum.accumulate(np.clip(centre + radius, 0.0, 1.0), axis=-1)
    return lower, upper


def clip_rewards(x: np.ndarray) -> tuple[np.ndarray, int]:
    """x clipped to [0, 1] and how many values were outside; NaN or infinite values raise."""
    x = np.asarray(x, dtype=np.float64)
    if not bool(np.isfinite(x).all()):
        raise ObservationError("rewards must be finite numbers, got NaN or infinity")
    outside = int(((x < 0) | (x > 1)).sum())
    return np.clip(x, 0.0, 1.0), outside


def sample_ratio_log_evidence(assigned: np.ndarray, planned: np.ndarray | float) -> np.ndarray:
    """log of the sample-ratio mixture martingale after each assignment: assigned is (..., n) booleans
    (True = candidate), planned the candidate's planned fraction, broadcastable to it.

    It fires (the split is not the planned one) once it reaches log(1 / alpha).
    """
    a = np.asarray(assigned)
    p = np.asarray(planned, dtype=np.float64)
    p = np.broadcast_to(p, np.broadcast_shapes(p.shape, a.shape[-1:]))  # (n,) unless it varies per stream
    if bool((p <= 0).any()) or bool((p >= 1).any()):
        raise ObservationError("a planned fraction must be strictly between 0 and 1")
    # log wealth of tilt k after t assignments: k * (assignments to the candidate) - sum log(1 - p + p e^k).
    to_candidate = np.cumsum(a, axis=-1, dtype=np.float64)
    log_wealth = [
        tilt * to_candidate - np.cumsum(np.log1p(p * math.expm1(tilt)), axis=-1) for tilt in SRM_TILTS
    ]
    top = np.maximum.reduce(log_wealth)
    total = sum(np.exp(w - top) for w in log_wealth)
    return top + np.log(total) - math.log(len(SRM_TILTS))


# --- one stream at a time ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BoundedMean:
    """The running state of one CS for a mean in [0, 1]: `add` returns the state after one more value."""

    alpha: float
    max_bet: float = 0.5
    n: int = 0
    total: float = 0.0
    squares: float = 0.0  # sum of (x_i - mu_i)^2, for the variance estimate
    bets: float = 0.0
    weighted: float = 0.0  # sum of lambda_i x_i
    penalties: float = 0.0
    lower: float = 0.0
    upper: float = 1.0

    def add(self, x: float) -> BoundedMean:
        """The state after `x` (already in [0, 1]); the same arithmetic as `confidence_sequence`."""
        log_term = math.log(2 / self.alpha)
        t = self.n + 1
        mean_before = (0.5 + self.total) / t
        var_before = (0.25 + self.squares) / t
        bet = min(math.sqrt(2 * log_term / (var_before * t * math.log1p(t))), self.max_bet)
        total = self.total + x
        squares = self.squares + (x - (0.5 + total) / (t + 1)) ** 2
        bets = self.bets + bet
        weighted = self.weighted + bet * x
        penalties = self.penalties + (x - mean_before) ** 2 * (-math.log1p(-bet) - bet)
        centre, radius = weighted / bets, (log_term + penalties) / bets
        lower = max(self.lower, min(max(centre - radius, 0.0), 1.0))
        upper = min(self.upper, min(max(centre + radius, 0.0), 1.0))
        return replace(
            self,
            n=t,
            total=total,
            squares=squares,
            bets=bets,
            weighted=weighted,
            penalties=penalties,
            lower=lower,
            upper=upper,
        )

    def extend(self, x: np.ndarray) -> BoundedMean:
        """The state after every value of `x` (1-D, already in [0, 1]) in order: `add` once per
        value, computed with cumulative sums (as `confidence_sequence` does), for long streams
        read in pages; equal to the repeated `add` up to rounding."""
        x = np.asarray(x, dtype=np.float64)
        if x.size == 0:
            return self
        log_term = math.log(2 / self.alpha)
        t = np.arange(self.n + 1, self.n + x.size + 1, dtype=np.float64)
        total = self.total + np.cumsum(x)  # the sum after each value
        total_before = np.concatenate(([self.total], total[:-1]))
        squares = self.squares + np.cumsum((x - (0.5 + total) / (t + 1)) ** 2)
        squares_before = np.concatenate(([self.squares], squares[:-1]))
        mean_before = (0.5 + total_before) / t
        var_before = (0.25 + squares_before) / t
        bet = np.minimum(np.sqrt(2 * log_term / (var_before * t * np.log1p(t))), self.max_bet)
        bets = self.bets + np.cumsum(bet)
        weighted = self.weighted + np.cumsum(bet * x)
        penalties = self.penalties + np.cumsum((x - mean_before) ** 2 * (-np.log1p(-bet) - bet))
        centre, radius = weighted / bets, (log_term + penalties) / bets
        return replace(
            self,
            n=self.n + x.size,
            total=float(total[-1]),
            squares=float(squares[-1]),
            bets=float(bets[-1]),
            weighted=float(weighted[-1]),
            penalties=float(penalties[-1]),
            lower=max(self.lower, float(np.clip(centre - radius, 0.0, 1.0).max())),
            upper=min(self.upper, float(np.clip(centre + radius, 0.0, 1.0).min())),
        )

    @property
    def mean(self) -> float:
        """The plain sample mean (0.5 before any value)."""
        return self.total / self.n if self.n else 0.5


def difference_bounds(candidate: BoundedMean, baseline: BoundedMean) -> tuple[float, float]:
    """A CS for candidate - baseline from two arms' CSs (each at alpha / 2: together at alpha)."""
    return candidate.lower - baseline.upper, candidate.upper - baseline.lower


def rate_breach(candidate: BoundedMean, baseline: BoundedMean, tolerance: float) -> bool:
    """True when the candidate's rate is credibly above the baseline's + tolerance."""
    return candidate.lower - baseline.upper > tolerance
