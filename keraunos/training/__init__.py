"""Training data: collect rollout groups from a gateway, turn their calls into rows, compute advantages.

`collect` talks HTTP; `trajectories` and `advantages` are pure functions over plain data and NumPy
arrays, so a backend (torch, verl) only turns their output into tensors. Import the submodules
directly; this package imports nothing on its own.
"""
