"""The gateway: the ASGI service holding the ledger (`/api`) and, later, the model proxy.

Import `keraunos.gateway.app.create_app` and `keraunos.gateway.config.GatewayConfig` directly;
this package module stays empty so that importing the config does not import FastAPI.
"""
