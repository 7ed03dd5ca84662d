"""The `/api` routes of PROTOCOL.md, one module per resource."""
