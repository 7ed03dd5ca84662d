"""Prompt optimisation (APO) over a versioned prompt resource: beam search with textual gradients,
Pareto-frontier reflection, random search; every candidate a resource version, every score from real
rollouts, the winner handed to a release (docs/optimize.md)."""
