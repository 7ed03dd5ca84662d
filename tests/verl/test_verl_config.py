"""The settings of a verl run (keraunos.training.backends.verl.config, which imports no verl): the
overrides docs/trainer.md lists are the ones `verl_overrides` gives, and a sample's fields become
the rollout's input as JSON. That verl accepts every override is checked in .venv-verl by
test_verl_agent_loop.py, which composes verl's own config with them."""

from __future__ import annotations

import re

import numpy as np
from prerequisites import REPO

from keraunos.training.backends.verl.config import KeraunosVerlConfig, verl_overrides


def test_the_overrides_in_the_docs_are_the_ones_verl_overrides_gives() -> None:
    doc = (REPO / "docs" / "trainer.md").read_text(encoding="utf-8")
    section = doc[doc.index("### The verl settings that make its update keraunos's") :]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1).split() == verl_overrides(group_size=8, batch_size=32)


def test_a_samples_fields_become_the_rollouts_input_as_json() -> None:
    sample = {
        "raw_prompt": np.array([{"role": "user", "content": "2+2"}], dtype=object),
        "extra_info": {"question": "2+2", "answer": np.int64(4)},
        "index": np.int64(3),
        "uid": "u",
    }
    config = KeraunosVerlConfig(server_url="http://gateway")
    assert config.rollout_input(sample) == {
        "raw_prompt": [{"role": "user", "content": "2+2"}],
        "extra_info": {"question": "2+2", "answer": 4},
    }
    whole = KeraunosVerlConfig(server_url="http://gateway", input_field="extra_info")
    assert whole.rollout_input(sample) == {"question": "2+2", "answer": 4}
