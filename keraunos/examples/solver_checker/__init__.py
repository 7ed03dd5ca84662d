"""The solver-checker example: two agents in one rollout, a calc solver and a checker of its answer.

Each agent is on its own agent base URL (docs/multi-agent.md#training-chosen-agents).

Modules: `dialogue` (the two agents' turns and rewards, pure), `agent` (the rollout entry point
`SolverCheckerAgent`, on the official `openai` client). The questions are the calc example's
(`python -m keraunos.examples.calc.dataset`).
"""
