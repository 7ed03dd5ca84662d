"""The calc example: a multi-turn agent that may call a calculator tool, rewarded for exact answers.

Modules: `protocol` (the tag protocol and a safe calculator, pure), `agent` (the conversation loop
and the rollout entry point `CalcAgent`), `dataset` (seeded questions as JSONL). See README.md.
"""
