"""Re-reward: score stored rollouts again with a new reward function or an LLM judge, recorded as a
named reward version beside the agent's own reward, never over it (docs/lifecycle.md#re-reward)."""
