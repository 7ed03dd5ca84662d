"""Rendezvous routing: sticky per rollout, minimal movement, even spread, cool-down fail-over."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.gateway.proxy.routing import Cooldowns, choose, rank

ENDPOINTS = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 5)]
rollout_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40)
endpoint_sets = st.lists(
    st.sampled_from([f"http://h{i}:8000/v1" for i in range(12)]), min_size=1, max_size=8, unique=True
)
derandomised = settings(derandomize=True, database=None, max_examples=200, deadline=None)


@derandomised
@given(rollout_id=rollout_ids, endpoints=endpoint_sets, shuffled=st.randoms(use_true_random=False))
def test_a_rollout_never_hops_while_the_endpoints_stay_the_same(rollout_id, endpoints, shuffled) -> None:
    first = choose(rollout_id, endpoints)
    reordered = list(endpoints)
    shuffled.shuffle(reordered)
    assert choose(rollout_id, reordered) == first  # order of registration does not matter
    assert choose(rollout_id, endpoints) == first
    assert first == rank(rollout_id, endpoints)[0]


@derandomised
@given(
    rollout_ids=st.lists(rollout_ids, min_size=1, max_size=50, unique=True), gone=st.sampled_from(ENDPOINTS)
)
def test_removing_one_endpoint_moves_exactly_its_rollouts(rollout_ids, gone) -> None:
    remaining = [endpoint for endpoint in ENDPOINTS if endpoint != gone]
    for rollout_id in rollout_ids:
        before = choose(rollout_id, ENDPOINTS)
        after = choose(rollout_id, remaining)
        if before == gone:
            assert after == rank(rollout_id, ENDPOINTS)[1]  # its next choice
        else:
            assert after == before


def test_rollouts_spread_about_evenly() -> None:
    counts = Counter(choose(f"rollout-{i}", ENDPOINTS) for i in range(8000))
    assert set(counts) == set(ENDPOINTS)
    for count in counts.values():
        assert abs(count - 2000) < 200, counts


def test_an_endpoint_in_cool_down_is_skipped_until_it_ends() -> None:
    cooldowns = Cooldowns()
    rollouts = [f"r{i}" for i in range(200)]
    home = {rollout: choose(rollout, ENDPOINTS) for rollout in rollouts}
    sick = ENDPOINTS[2]
    cooldowns.eject(sick, now=100.0, duration=10.0)
    for rollout in rollouts:
        during = choose(rollout, ENDPOINTS, cooldowns, now=105.0)
        assert during != sick
        if home[rollout] == sick:
            assert during == rank(rollout, ENDPOINTS)[1]
        else:
            assert during == home[rollout]
    assert cooldowns.snapshot(105.0) == {sick: 5.0}
    assert all(choose(rollout, ENDPOINTS, cooldowns, now=110.0) == home[rollout] for rollout in rollouts)
    assert cooldowns.snapshot(110.0) == {}


def test_when_every_endpoint_cools_down_the_best_one_is_still_used() -> None:
    cooldowns = Cooldowns()
    for endpoint in ENDPOINTS:
        cooldowns.eject(endpoint, now=0.0, duration=60.0)
    assert choose("r", ENDPOINTS, cooldowns, now=1.0) == choose("r", ENDPOINTS)
    assert choose("r", [], cooldowns, now=1.0) is None
