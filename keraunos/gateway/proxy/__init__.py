"""The model proxy: agents' OpenAI calls go through here to the model endpoints and are recorded.

`routing` picks the endpoint, `shaping` the forwarded body, `record` the event (all three pure);
`upstream` makes the call with retries, `routes` is the HTTP shell (`pause_routes` its pause and
drain routes), `state` and `cache` hold what lives on the app. `exact` (pure) and `exact_tokens`
(its `/tokenize` calls) are the `--exact-tokens` option.
"""

from keraunos.gateway.proxy import pause_routes  # noqa: F401  (registers the pause routes on `router`)
from keraunos.gateway.proxy.cache import CacheEvents
from keraunos.gateway.proxy.routes import router
from keraunos.gateway.proxy.state import ProxyState, proxy_lifespan

__all__ = ["CacheEvents", "ProxyState", "proxy_lifespan", "router"]
