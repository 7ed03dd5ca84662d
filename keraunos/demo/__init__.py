"""`keraunos demo`: a tiny model prepared on the spot, warm-started on the calc agent's format, then
trained with GRPO on the calc agent's rollouts, on a laptop CPU, with no network. See docs/demo.md.

Modules: `recipe` (what the tiny model is and what it is warm-started on, pure), `sft` (the
supervised warm start), `prepare` (building and caching the prepared model), `plot` (the reward
curve), `config` (the command's settings), `command` (the command).
"""
