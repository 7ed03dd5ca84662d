"""The per-instance Pareto frontier of candidates, and sampling parents from it (pure).

Selecting by the mean keeps one kind of good prompt; the frontier keeps every candidate that is the
best on some instance, so a prompt that alone solves a rare case survives beside the one that
solves the common cases, and reflection can start from either. A candidate on the frontier is
weighted by how many instances it leads, so the broad ones are picked more often.
"""

from __future__ import annotations

import random
from collections.abc import Mapping


def dominates(first: Mapping[str, float], second: Mapping[str, float]) -> bool:
    """Whether `first` scores at least as well as `second` on every instance and better on one."""
    return all(first[i] >= second[i] for i in second) and any(first[i] > second[i] for i in second)


def pareto_frontier(scores: Mapping[int, Mapping[str, float]]) -> dict[int, int]:
    """{version: number of instances it leads} for the candidates on the frontier.

    `scores` maps each candidate's version to its rewards on the same instances (instance id ->
    reward). A candidate leads an instance when no candidate scores higher there; an instance on
    which every candidate scores the same distinguishes nobody and is not counted (when no instance
    distinguishes anyone, every candidate leads with weight 1). A leader that another candidate
    dominates is removed: its dominator also leads each instance it led, so the weights of the rest
    do not change.
    """
    versions = sorted(scores)
    instances = sorted({i for rewards in scores.values() for i in rewards})
    leads: dict[int, int] = {}
    for instance in instances:
        rewards = {v: scores[v][instance] for v in versions}
        best = max(rewards.values())
        if best == min(rewards.values()):
            continue
        for version in versions:
            if rewards[version] == best:
                leads[version] = leads.get(version, 0) + 1
    if not leads:
        leads = dict.fromkeys(versions, 1)
    return {
        version: count
        for version, count in sorted(leads.items())
        if not any(dominates(scores[other], scores[version]) for other in leads if other != version)
    }


def sample_frontier(frontier: Mapping[int, int], rng: random.Random, count: int = 1) -> list[int]:
    """`count` distinct versions of the frontier (fewer when it is smaller), each draw weighted by
    the instances the version leads, with the search's seeded generator."""
    left = dict(sorted(frontier.items()))
    chosen: list[int] = []
    while left and len(chosen) < count:
        (version,) = rng.choices(list(left), weights=list(left.values()))
        chosen.append(version)
        del left[version]
    return chosen
