"""keraunos: train AI agents with reinforcement learning while they run in their real harnesses.

This module imports nothing: agent images install keraunos without its dependencies.
"""

__version__ = "0.1.0"
