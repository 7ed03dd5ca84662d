"""The HTTP server's own limits, set from the gateway's config: connections at once, keep-alive."""

from __future__ import annotations

from collections.abc import Callable

import httpx


def test_connections_beyond_max_connections_get_503_and_a_freed_one_is_served(
    gateway_factory: Callable,
) -> None:
    # uvicorn counts the requesting connection itself: with 2, one other connection may be open.
    gateway = gateway_factory(args=("--max-connections", "2", "--keep-alive-timeout-s", "30"))
    with httpx.Client(base_url=gateway.base_url) as holder:
        assert holder.get("/healthz").status_code == 200  # its connection stays open (keep-alive)
        with httpx.Client(base_url=gateway.base_url) as second:
            assert second.get("/healthz").status_code == 503
    with httpx.Client(base_url=gateway.base_url) as later:
        assert later.get("/healthz").status_code == 200
