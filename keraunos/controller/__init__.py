"""The controller: turns queued rollouts into running agents and reports how each attempt ended.

`keraunos controller` runs `reconcile.Reconciler` over a `LocalRunner`. This module imports
nothing, because every local agent process starts through `keraunos.controller._agent_main`.
"""
