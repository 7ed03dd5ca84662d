"""Training only the chosen agents (keraunos.training.agents): which calls are selected, each agent's
calls merged among themselves with the others' turns as observation, and whose reward and baseline
each agent's rows get, checked against a direct computation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos._settings import ConfigError
from keraunos.ledger.codec._triplet import trim_reward
from keraunos.training._data import CompletedRollout, PositionedReward, Triplet
from keraunos.training._read import read_events
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.agents import AgentAdvantage, agent_selected, is_pattern, select_agents
from keraunos.training.credit import Credit, call_advantages, call_returns
from keraunos.training.train_config import TrainConfig
from keraunos.training.trajectories import TrajectoryConfig, build_rows

PROPERTY = settings(
    derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
GRPO = AdvantageConfig()


def call(prompt: list[int], response: list[int], agent: str | None, **extra: object) -> Triplet:
    return Triplet(np.array(prompt), np.array(response), agent_id=agent, **extra)  # type: ignore[arg-type]


def solver_checker_rollout(rid: str = "r0", group: str = "g", reward: float = 1.0) -> CompletedRollout:
    """The solver answers (call 0), the checker reviews it (call 1), the solver answers again with
    the checker's turns in its prompt (call 2): [1 2] -> 3, then the checker's [.. 7] -> 8, then the
    solver's prompt [1 2 3 7 8 9] continues its own first call after the checker's ids 7 8 9."""
    return CompletedRollout(
        rid,
        group,
        [
            call([1, 2], [3], "solver"),
            call([1, 2, 3, 7], [8], "checker", extends_previous=True),
            call([1, 2, 3, 7, 8, 9], [4, 5], "solver", extends_previous=True),
        ],
        reward,
    )


# -- which calls are selected ------------------------------------------------------------------------


def test_no_agents_selects_every_call_and_agents_select_by_id_or_shell_pattern_never_an_untagged_call() -> (
    None
):
    assert agent_selected(None, []) and agent_selected("solver", [])
    assert agent_selected("solver", ["solver"]) and not agent_selected("checker", ["solver"])
    assert agent_selected("sub-planner", ["sub-*"]) and agent_selected("a1", ["a[0-9]"])
    assert not agent_selected("Solver", ["solver"])  # ids are case-sensitive, as the ledger stores them
    assert not agent_selected(None, ["*"])
    assert is_pattern("sub-*") and is_pattern("a?") and is_pattern("a[12]") and not is_pattern("solver")


def test_each_selected_agent_gets_a_view_of_its_own_calls_in_call_order_and_the_others_are_counted() -> None:
    rollout = solver_checker_rollout()
    both = select_agents([rollout], ["solver", "checker"])
    assert [v.agent_id for v in both.views] == ["solver", "checker"]  # in the order of first calls
    assert [t.response_ids.tolist() for t in both.views[0].triplets] == [[3], [4, 5]]
    assert [t.response_ids.tolist() for t in both.views[1].triplets] == [[8]]
    assert both.source == [0, 0]
    solver = select_agents([rollout], ["solver"])
    assert [v.agent_id for v in solver.views] == ["solver"]
    assert solver.metrics["selected_calls"] == 2 and solver.metrics["unselected_calls"] == 1
    assert solver.metrics["agent_calls/solver"] == 2 and "agent_calls/checker" not in solver.metrics
    assert all(v.rollout_id == "r0" and v.group_id == "g" for v in both.views)


def test_a_rollout_without_a_call_of_a_selected_agent_gives_no_view_and_is_counted() -> None:
    only_checker = CompletedRollout("r1", "g", [call([1], [2], "checker"), call([5], [6], None)], 0.0)
    selection = select_agents([solver_checker_rollout(), only_checker], ["solver"])
    assert selection.source == [0]
    assert selection.metrics["rollouts_without_selected_agent"] == 1
    assert selection.metrics["unselected_calls"] == 3  # the checker's call, the untagged one, r0's checker


def test_selecting_nothing_is_a_caller_error_not_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="without any, every call trains"):
        select_agents([solver_checker_rollout()], [])


# -- rows: each agent's calls merge among themselves ---------------------------------------------------


def test_the_solvers_calls_merge_into_one_row_with_the_checkers_turns_as_observation() -> None:
    view = select_agents([solver_checker_rollout()], ["solver"]).views[0]
    # The reader's flag was about the checker's call right before; the view compares ids itself.
    assert [t.extends_previous for t in view.triplets] == [False, False]
    rows = build_rows([view], TrajectoryConfig(max_prompt_len=4, max_response_len=8)).rows
    assert len(rows) == 1
    response = rows.input_ids[0, 4:].tolist()
    assert response[:6] == [3, 7, 8, 9, 4, 5]
    # The checker's 7 8 9 (its prompt turn, its answer, the glue after it) never train.
    assert rows.response_mask[0, :6].tolist() == [1, 0, 0, 0, 1, 1]
    assert rows.call_index[0, :6].tolist() == [0, -1, -1, -1, 1, 1]


def test_the_readers_flag_is_kept_when_the_agents_previous_call_is_the_one_right_before() -> None:
    rollout = CompletedRollout(
        "r",
        "g",
        [call([1], [2], "solver"), call([1, 2, 3], [4], "solver", extends_previous=True)],
        1.0,
    )
    assert [t.extends_previous for t in select_agents([rollout], ["solver"]).views[0].triplets] == [
        False,
        True,
    ]


# -- whose reward, and which baseline -----------------------------------------------------------------


def rewarded(rid: str, solver: float | None, checker: float | None, final: float) -> CompletedRollout:
    """A solver-checker rollout whose solver and checker posted their own rewards (None: not), and
    the rollout's untagged final reward last."""
    base = solver_checker_rollout(rid, "g", final)
    posted = []
    if solver is not None:
        posted.append(PositionedReward(solver, 0, agent_id="solver"))
    if checker is not None:
        posted.append(PositionedReward(checker, 1, agent_id="checker"))
    posted.append(PositionedReward(final, 2))
    return CompletedRollout(rid, "g", base.triplets, final, rewards=tuple(posted))


def test_under_rollout_every_agent_gets_the_rollouts_reward_and_under_agent_its_own_else_the_rollouts() -> (
    None
):
    rollout = rewarded("r", solver=0.25, checker=None, final=1.0)
    by_rollout = select_agents([rollout], ["solver", "checker"], "rollout").views
    assert [v.reward for v in by_rollout] == [1.0, 1.0]
    by_agent = select_agents([rollout], ["solver", "checker"], "agent").views
    assert [v.reward for v in by_agent] == [0.25, 1.0]
    # The checker posted nothing of its own: the rollout's reward, at its last call (a filled reward).
    assert by_agent[1].rewards == ()
    assert by_agent[0].rewards == (PositionedReward(0.25, 0, agent_id="solver"),)


def test_rewards_move_to_the_agents_last_call_at_or_before_the_call_they_followed() -> None:
    base = solver_checker_rollout()
    posted = (
        PositionedReward(0.5, 1, agent_id="checker"),  # after the checker's call: the solver's call 0
        PositionedReward(2.0, 2),  # after the solver's second call: its call 1
    )
    view = select_agents([CompletedRollout("r", "g", base.triplets, 2.0, rewards=posted)], ["solver"]).views[
        0
    ]
    assert [r.after_call for r in view.rewards] == [0, 1]
    checker = select_agents([CompletedRollout("r", "g", base.triplets, 2.0, rewards=posted)], ["checker"])
    assert [r.after_call for r in checker.views[0].rewards] == [0, 0]


def test_the_baseline_is_each_agents_own_across_the_groups_rollouts() -> None:
    """Two rollouts of one group: under `agent` the solver's advantages come from the solvers'
    rewards (0.0 vs 1.0) and the checker's from the checkers' (0.5 vs 0.5: no signal)."""
    group = [rewarded("a", 0.0, 0.5, 1.0), rewarded("b", 1.0, 0.5, 0.0)]
    views = select_agents(group, ["solver", "checker"], "agent").views
    got = rollout_advantages([v.reward for v in views], [v.baseline_group for v in views], GRPO).advantages
    solver = rollout_advantages([0.0, 1.0], ["g", "g"], GRPO).advantages
    assert [v.agent_id for v in views] == ["solver", "checker", "solver", "checker"]
    np.testing.assert_allclose(got, [solver[0], 0.0, solver[1], 0.0])
    # Under `rollout` both agents of a rollout share its reward; each agent is still baselined alone.
    views = select_agents(group, ["solver", "checker"], "rollout").views
    got = rollout_advantages([v.reward for v in views], [v.baseline_group for v in views], GRPO).advantages
    final = rollout_advantages([1.0, 0.0], ["g", "g"], GRPO).advantages
    np.testing.assert_allclose(got, [final[0], final[0], final[1], final[1]])


def test_an_untagged_views_baseline_group_is_the_rollouts_group() -> None:
    assert solver_checker_rollout(group="row-7").baseline_group == "row-7"


# -- property: per-agent credit against a direct computation ------------------------------------------

AGENTS = ("solver", "checker", None)


@st.composite
def multi_agent_group(draw: st.DrawFn) -> list[CompletedRollout]:
    """Rollouts of 1-3 groups, each of 1-6 calls by random agents (None: untagged), with rewards
    tagged by random agents after random calls."""
    rollouts = []
    for i in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 6))
        agents = draw(st.lists(st.sampled_from(AGENTS), min_size=n, max_size=n))
        triplets = [call([100 * i + k], [k + 1], a) for k, a in enumerate(agents)]
        posted = draw(
            st.lists(
                st.tuples(st.integers(0, n - 1), st.sampled_from(AGENTS), st.integers(-3, 3)),
                max_size=5,
            )
        )
        rewards = tuple(PositionedReward(float(v), at, agent_id=a) for at, a, v in posted)
        final = rewards[-1].value if rewards else 0.0
        group = f"g{draw(st.integers(0, 2))}"
        rollouts.append(CompletedRollout(f"r{i}", group, triplets, final, rewards=rewards))
    return rollouts


def direct_call_rewards(rollout: CompletedRollout, agent: str, advantage: AgentAdvantage) -> list[float]:
    """r_k of the agent's k-th call, written out: every reward it counts that was posted after its
    k-th call and before its next (or, for k = 0, anywhere before its second call)."""
    positions = [i for i, t in enumerate(rollout.triplets) if t.agent_id == agent]
    counted = [r for r in rollout.rewards if advantage == "rollout" or r.agent_id == agent]
    out = [0.0] * len(positions)
    if not counted:
        own = [r.value for r in rollout.rewards if r.agent_id == agent]
        out[-1] = own[-1] if own else rollout.reward
        return out
    for reward in counted:
        k = max([j for j, i in enumerate(positions) if i <= reward.after_call], default=0)
        out[k] += reward.value
    return out


@PROPERTY
@given(
    multi_agent_group(),
    st.sampled_from([["solver"], ["solver", "checker"], ["*"]]),
    st.sampled_from(["rollout", "agent"]),
    st.sampled_from(["return_to_go", "per_turn", "final"]),
)
def test_per_agent_call_advantages_equal_a_direct_computation(
    rollouts: list[CompletedRollout], agents: list[str], advantage: AgentAdvantage, credit: Credit
) -> None:
    selection = select_agents(rollouts, agents, advantage)
    # The views hold exactly the selected calls, every one once.
    for index, rollout in enumerate(rollouts):
        views = [v for v, s in zip(selection.views, selection.source, strict=True) if s == index]
        held = sorted(k for v in views for k in (int(t.prompt_ids[0]) for t in v.triplets))
        assert held == sorted(
            int(t.prompt_ids[0]) for t in rollout.triplets if agent_selected(t.agent_id, agents)
        )
    got = call_advantages(selection.views, credit, GRPO).per_call
    # Direct: each (rollout, agent)'s returns, baselined per call position among the same agent's
    # views of the same group.
    keys = [
        (rollouts[s].group_id, v.agent_id) for v, s in zip(selection.views, selection.source, strict=True)
    ]
    returns = []
    for view, s in zip(selection.views, selection.source, strict=True):
        r = np.array(direct_call_rewards(rollouts[s], str(view.agent_id), advantage))
        returns.append(call_returns(r, credit) if credit != "final" else np.full(r.shape, view.reward))
    for i, key in enumerate(keys):
        for t in range(len(returns[i])):
            # `final`: one advantage per view, baselined among all of the key's views; else per position.
            peers = [j for j, k in enumerate(keys) if k == key and (credit == "final" or len(returns[j]) > t)]
            values = np.array([returns[j][min(t, len(returns[j]) - 1)] for j in peers])
            if len(peers) < 2 or np.ptp(values) == 0:
                expected = 0.0
            else:
                expected = (returns[i][t] - values.mean()) / (values.std(ddof=1) + GRPO.epsilon)
            assert got[i][t] == pytest.approx(expected, rel=1e-5, abs=1e-5), (i, t, key)


# -- the reader and the triplet view carry whose call and whose reward it is ---------------------------


def test_the_reader_keeps_each_calls_agent_and_the_triplet_view_keeps_each_rewards_agent() -> None:
    stored = {"value": 0.5, "agent_id": "checker", "turn": 1, "message": "left out of the view"}
    assert trim_reward(stored) == {"value": 0.5, "agent_id": "checker", "turn": 1}
    read = read_events(
        [
            {
                "event_type": "model_request",
                "data": {"prompt_token_ids": [1], "response_token_ids": [2], "agent_id": "solver"},
            },
            {
                "event_type": "model_request",
                "data": {"prompt_token_ids": [1, 2, 3], "response_token_ids": [4]},
            },
            {"event_type": "reward", "data": trim_reward(stored)},
        ]
    )
    assert [t.agent_id for t in read.triplets] == ["solver", None]
    assert read.rewards == (PositionedReward(0.5, 1, agent_id="checker", turn=1),)


# -- the configuration ---------------------------------------------------------------------------------

BASE = {"dataset": "rows.jsonl", "model": "m", "agent_class": "a:B"}


def test_agents_are_a_comma_separated_flag_or_a_yaml_list_and_default_to_every_call() -> None:
    assert TrainConfig.load(BASE).agents == []
    assert TrainConfig.load({**BASE, "agents": "solver, checker"}).agents == ["solver", "checker"]
    assert TrainConfig.load({**BASE, "agents": ["sub-*", "solver", "solver"]}).agents == ["sub-*", "solver"]
    assert TrainConfig.load({**BASE, "agents": "solver"}).agent_advantage == "rollout"


def test_an_agents_entry_that_is_no_id_nor_a_pattern_of_one_is_a_one_line_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"invalid value 'sol ver' for agents \(from --agents\).*no agent id"
    ):
        TrainConfig.load({**BASE, "agents": "sol ver"})


def test_a_lora_run_refuses_a_pattern_because_it_registers_its_adapter_for_each_agent_by_name() -> None:
    with pytest.raises(ConfigError, match="agents 'sub-\\*' is a pattern: a LoRA run registers"):
        TrainConfig.load({**BASE, "agents": "solver,sub-*", "lora_rank": 4})
    assert TrainConfig.load({**BASE, "agents": "sub-*"}).agents == ["sub-*"]  # full weights: fine
    assert TrainConfig.load({**BASE, "agents": "solver", "lora_rank": 4}).lora_rank == 4
