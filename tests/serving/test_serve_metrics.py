"""`GET /metrics` of the model server: the gateway's key rule, and what requests, batches and swaps count.

The text exposition is read back with `prometheus_client`'s own parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

TINY_NAME = "tiny/served"
KEY = "m3trics-key"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: Samples, name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


def scrape(base_url: str, **headers: str) -> Samples:
    response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def test_keraunos_serve_metrics_need_the_api_key_and_count_requests_batches_and_tokens(
    serve_process: Any, tiny_dir: Path
) -> None:
    served = serve_process("--model", str(tiny_dir), "--served-model-name", TINY_NAME, "--api-key", KEY)
    assert httpx.get(f"{served.base_url}/metrics").status_code == 401
    assert httpx.get(f"{served.base_url}/metrics", headers={"x-api-key": "wrong"}).status_code == 401
    before = scrape(served.base_url, authorization=f"Bearer {KEY}")
    assert value(before, "keraunos_serve_batch_size_count") == 0

    answer = httpx.post(
        f"{served.endpoint}/completions",
        json={"model": TINY_NAME, "prompt": "What is", "max_tokens": 4, "n": 2},
        headers={"x-api-key": KEY},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]

    after = scrape(served.base_url, **{"x-api-key": KEY})
    assert value(after, "keraunos_serve_requests_total", route="/v1/completions", status="200") == 1
    assert value(after, "keraunos_serve_requests_total", route="/metrics", status="401") == 2
    assert value(after, "keraunos_serve_batch_size_count") == 1
    assert value(after, "keraunos_serve_batch_size_sum") == 2  # the request's two choices, one batch
    assert value(after, "keraunos_serve_batch_seconds_sum") > 0
    # The server's usage counts the prompt once; the model ran it once per choice.
    assert value(after, "keraunos_serve_prompt_tokens_total") == 2 * usage["prompt_tokens"]
    assert value(after, "keraunos_serve_completion_tokens_total") == usage["completion_tokens"]
    assert value(after, "keraunos_serve_requests_waiting") == 0
    assert value(after, "keraunos_serve_sequences_running") == 0
    assert value(after, "keraunos_serve_weights_version") == 0


def test_metrics_public_opens_only_metrics_and_each_server_counts_for_itself(make_server: Any) -> None:
    public = make_server(api_key=KEY, metrics_public=True)
    other = make_server(api_key=KEY)
    assert httpx.get(f"{public.endpoint}/models").status_code == 401  # the model routes keep the key
    assert httpx.get(f"{public.url}/no/such/route").status_code == 404

    scraped = scrape(public.url)  # no key needed
    assert value(scraped, "keraunos_serve_requests_total", route="/v1/models", status="401") == 1
    assert value(scraped, "keraunos_serve_requests_total", route="other", status="404") == 1
    # Two servers in one process on one model: counters of their own.
    assert httpx.get(f"{other.url}/metrics").status_code == 401
    untouched = scrape(other.url, authorization=f"Bearer {KEY}")
    assert value(untouched, "keraunos_serve_requests_total", route="/v1/models", status="401") == 0


def test_weight_swaps_are_counted_with_the_version_served_and_no_key_means_open_metrics(
    make_server: Any,
) -> None:
    running = make_server()  # no --api-key: every route is open, /metrics too
    server = running.server
    version = server.version
    weights = {k: v.clone() for k, v in server.runner.model.state_dict().items()}
    try:
        server.load_weights(weights, version=version + 5)
        scraped = scrape(running.url)
        assert value(scraped, "keraunos_serve_weight_swaps_total") == 1
        assert value(scraped, "keraunos_serve_weight_swap_seconds_count") == 1
        assert value(scraped, "keraunos_serve_weights_version") == version + 5
    finally:
        server.load_weights(weights, version=version)
