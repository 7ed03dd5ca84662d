"""From the compact triplet read to padded training arrays: the trainer's CPU cost per batch.

    taskset -c 0 python benchmarks/trajectories.py --runs 3
    taskset -c 0 python benchmarks/trajectories.py --level transition --max-prompt 6144 --max-response 128

Builds `--rollouts` rollouts of `--turns` calls (first prompt `--first-prompt` ids, each call
answering `--response` ids with log probs and receiving `--observation` ids of tool output, so the
prompt grows by response + observation a turn), trims them as the gateway's `format=triplet` does
and serialises the `delta=1` response body of each rollout, as a collector receives it. Not timed.

Timed, per run, on the calling thread: JSON decoding of every body, delta resolution into
`Triplet`s, trajectory merging into left/right-padded NumPy rows (`build_rows`), GRPO advantages
and per-rollout loss weights. Reported: wall and CPU seconds (min / median / max over `--runs`),
tokens per second (every distinct id of a rollout: first prompt, responses, observations) and
trainable tokens per second, and the body sizes of the delta and the full triplet reads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keraunos.ledger.codec._triplet import dedupe_model_requests, trim_model_request
from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events_json
from keraunos.training.advantages import AdvantageConfig, rollout_advantages, rollout_loss_weights
from keraunos.training.trajectories import TrajectoryConfig, build_rows

VOCAB = 151_936


def rollout_events(rng: np.random.Generator, args: argparse.Namespace) -> list[dict[str, object]]:
    """Recorded `model_request` data of one growing-prefix rollout, plus its reward, as triplet events."""
    prompt = rng.integers(0, VOCAB, args.first_prompt).tolist()
    events: list[dict[str, object]] = []
    for _ in range(args.turns):
        response = rng.integers(0, VOCAB, args.response).tolist()
        logprobs = (-rng.exponential(0.5, args.response)).tolist()
        data = {
            "response": {
                "prompt_token_ids": prompt,
                "choices": [
                    {"token_ids": response, "logprobs": {"content": [{"logprob": x} for x in logprobs]}}
                ],
            },
            "server": {"model": "policy", "version": 7},
            "http_status": 200,
            "status": "ok",
        }
        events.append({"event_type": "model_request", "data": trim_model_request(data)})
        prompt = prompt + response + rng.integers(0, VOCAB, args.observation).tolist()
    events.append({"event_type": "reward", "data": {"value": float(rng.integers(0, 2))}})
    return dedupe_model_requests(events)


def run_once(bodies: list[bytes], config: TrajectoryConfig, n: int) -> tuple[float, float, int, int]:
    """(wall s, CPU s, rows, trainable tokens) of reading every body into rows with advantages."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rollouts = []
    for i, body in enumerate(bodies):
        read = read_events_json(body)
        group = f"g{i // n}"
        rollouts.append(CompletedRollout(f"r{i}", group, read.triplets, read.reward or 0.0))
    built = build_rows(rollouts, config)
    advantages = rollout_advantages(
        [r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig()
    )
    weights = rollout_loss_weights(built.rows.response_mask, built.rows.rollout_index)
    per_token = advantages.advantages[built.rows.rollout_index][:, None] * weights
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert per_token.shape == built.rows.response_mask.shape
    return wall, cpu, len(built.rows), int(built.rows.response_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--first-prompt", type=int, default=2000)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--observation", type=int, default=50)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--level", choices=["trajectory", "transition"], default="trajectory")
    parser.add_argument("--max-prompt", type=int, default=2048)
    parser.add_argument("--max-response", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    bodies, full_bytes = [], 0
    for _ in range(args.rollouts):
        events = rollout_events(rng, args)
        bodies.append(orjson.dumps(delta_encode(events), option=orjson.OPT_SERIALIZE_NUMPY))
        full_bytes += len(orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY))
    delta_bytes = sum(len(b) for b in bodies)
    config = TrajectoryConfig(
        level=args.level, max_prompt_len=args.max_prompt, max_response_len=args.max_response
    )
    per_rollout = args.first_prompt + args.turns * (args.response + args.observation) - args.observation
    tokens = args.rollouts * per_rollout

    samples = [run_once(bodies, config, args.group_size) for _ in range(args.runs)]
    walls = sorted(s[0] for s in samples)
    cpus = sorted(s[1] for s in samples)
    _, _, rows, trainable = samples[0]
    median = statistics.median(walls)
    print(f"# trajectories: {args.rollouts} rollouts x {args.turns} turns, level={args.level}")
    print(
        f"first prompt {args.first_prompt}, +{args.response + args.observation} ids a turn; rows {rows} x "
        f"({args.max_prompt} + {args.max_response})"
    )
    print(
        f"delta read: {delta_bytes / 1e6:.1f} MB ({delta_bytes / args.rollouts / 1e3:.0f} kB a rollout); "
        f"full triplet read would be {full_bytes / 1e6:.1f} MB"
    )
    print(f"wall s   min {walls[0]:.3f}  median {median:.3f}  max {walls[-1]:.3f}")
    print(f"CPU s    min {cpus[0]:.3f}  median {statistics.median(cpus):.3f}  max {cpus[-1]:.3f}")
    print(
        f"tokens/s (median wall): {tokens / median / 1e6:.2f} M distinct ids, "
        f"{trainable / median / 1e6:.2f} M trainable"
    )


if __name__ == "__main__":
    main()
