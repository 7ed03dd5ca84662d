"""The `/api` routes (docs/protocol.md#rollouts and the sections after it), one module per resource."""
