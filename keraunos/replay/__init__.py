"""`keraunos replay`: run a recorded rollout's agent again with its model calls answered from the record.

The gateway does the replaying (`keraunos.gateway.proxy.replay`); this package asks for a replay,
waits for it and says what it showed (`outcome`), for a person debugging an agent.
"""
