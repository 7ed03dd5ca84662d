"""A model-call cassette: an OpenAI-compatible server answering from a file, for exact, fast tests.

`POST /v1/chat/completions` is answered from a JSONL file, one line per recorded call:
`{"key": "sha256:...", "request": <body>, "response": <body>}`. The key is `cassette_key`: the
canonical JSON (sorted keys, no spaces) of the request body minus the top-level fields in `drop`
(none by default: the whole request, as sent, is the key; drop a field such as `user` or `seed`
only when a caller varies it per call and the answer does not depend on it).

- `replay`: a known request gets its recorded response; an unknown one gets `404` naming its key,
  and is remembered: `GET /cassette/misses` lists every miss, so a test fixture fails the test at
  teardown (`CassetteServer.check_no_misses`) instead of a live call slipping through silently.
- `record`: a known request is answered from the file too; an unknown one is forwarded to
  `upstream` (an OpenAI API root ending in /v1) and, when it answers 200, appended to the file.
  Other answers are passed back and not recorded.

Whole answers only: `stream: true` is `400` in both modes. `GET /v1/models` lists the models the
file's requests name, `GET /health` answers 200. Run it as `python -m keraunos.testing.cassette
--path FILE --mode replay` (options below, `--help`), or in-process with `start_cassette`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
import structlog
from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from keraunos._settings import ConfigError, LayeredSettings
from keraunos._uvicorn import ThreadedServer, server_config
from keraunos.optimize.proposer import request_key

log = structlog.get_logger("keraunos.testing.cassette")

Mode = Literal["record", "replay"]


class CassetteConfig(LayeredSettings):
    """The cassette server's settings: every field is a flag, a `KERAUNOS_CASSETTE_` variable and a YAML key."""

    model_config = SettingsConfigDict(env_prefix="KERAUNOS_CASSETTE_", extra="forbid", validate_default=True)

    path: Path = Field(
        default=Path("cassette.jsonl"),
        description="The JSONL file of recorded calls (record mode creates it).",
    )
    mode: Mode = Field(
        default="replay", description="replay: answer from the file only; record: forward misses."
    )
    upstream: str | None = Field(
        default=None,
        description="OpenAI API root (ending in /v1) that record mode forwards unknown requests to.",
    )
    upstream_key: str | None = Field(
        default=None, repr=False, description="Sent upstream as Authorization: Bearer KEY."
    )
    drop: tuple[str, ...] = Field(
        default=(),
        description="Top-level request fields left out of the key (comma-separated); none by default.",
    )
    timeout_s: float = Field(default=300.0, gt=0, description="Seconds an upstream call may take.")
    host: str = Field(default="127.0.0.1", description="Interface to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on (0: any free one).")

    @field_validator("drop", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("upstream")
    @classmethod
    def _api_root(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = value.rstrip("/")
        if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
            raise ValueError(f"must be an http(s) URL ending in /v1, got {value!r}")
        return url

    @model_validator(mode="after")
    def _record_needs_upstream(self) -> CassetteConfig:
        if self.mode == "record" and self.upstream is None:
            raise ValueError("record mode needs upstream (the model server to record from)")
        return self


def cassette_key(body: Mapping[str, Any], drop: Iterable[str] = ()) -> str:
    """The key of a request `body`: `request_key` of it without the top-level fields in `drop`."""
    dropped = set(drop)
    return request_key({name: value for name, value in body.items() if name not in dropped})


def load_cassette(path: Path, drop: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """The recorded responses of the file at `path` by key (empty when it does not exist yet).

    The key is computed again from each line's `request` with `drop`, so a cassette recorded with
    another drop list still answers; the first line of a key wins. `ConfigError` names the line of
    a file that is not a cassette."""
    drop = tuple(drop)
    entries: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return entries
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            request, response = row["request"], row["response"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a cassette line ({exc!r})") from None
        if not isinstance(request, dict) or not isinstance(response, dict):
            raise ConfigError(f"{path}:{number}: request and response must be JSON objects")
        entries.setdefault(cassette_key(request, drop), {"request": request, "response": response})
    return entries


class _Cassette:
    """The state of one cassette server: the recorded calls, the misses, the upstream client."""

    def __init__(self, config: CassetteConfig) -> None:
        self.config = config
        self.entries = load_cassette(config.path, config.drop)
        self.misses: list[dict[str, Any]] = []
        self.write_lock = asyncio.Lock()
        self.upstream: httpx.AsyncClient | None = None

    async def answer(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if body.get("stream"):
            return _error(400, "the cassette answers whole responses only: send stream false")
        key = cassette_key(body, self.config.drop)
        known = self.entries.get(key)
        if known is not None:
            return _json(200, known["response"])
        if self.config.mode == "replay":
            self.misses.append({"key": key, "request": body})
            log.warning("cassette miss", key=key, model=body.get("model"))
            return _error(404, f"no recorded answer for request {key} (replay mode; record it first)")
        return await self._record(key, body)

    async def _record(self, key: str, body: dict[str, Any]) -> Response:
        assert self.upstream is not None and self.config.upstream is not None
        try:
            upstream = await self.upstream.post(f"{self.config.upstream}/chat/completions", json=body)
        except httpx.TransportError as exc:
            return _error(502, f"upstream {self.config.upstream} did not answer: {exc!r}")
        if upstream.status_code != 200:
            return Response(upstream.content, upstream.status_code, media_type="application/json")
        try:
            response = upstream.json()
        except ValueError:
            return _error(502, f"upstream answered 200 with a body that is not JSON: {upstream.text[:200]!r}")
        async with self.write_lock:
            if key not in self.entries:
                self.entries[key] = {"request": body, "response": response}
                line = orjson.dumps({"key": key, "request": body, "response": response}) + b"\n"
                with self.config.path.open("ab") as file:
                    file.write(line)
                log.info("cassette recorded", key=key, model=body.get("model"))
        return _json(200, response)

    def models(self) -> list[str]:
        names = {entry["request"].get("model") for entry in self.entries.values()}
        return sorted(name for name in names if isinstance(name, str))


def create_cassette_app(config: CassetteConfig) -> Starlette:
    """The cassette server as an ASGI app (its upstream client opened and closed by the lifespan)."""
    cassette = _Cassette(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if config.mode == "record":
            headers = {"Authorization": f"Bearer {config.upstream_key}"} if config.upstream_key else {}
            cassette.upstream = httpx.AsyncClient(headers=headers, timeout=config.timeout_s)
        try:
            yield
        finally:
            if cassette.upstream is not None:
                await cassette.upstream.aclose()

    async def chat(request: Request) -> Response:
        return await cassette.answer(request)

    async def misses(request: Request) -> Response:
        return _json(200, {"misses": cassette.misses})

    async def models(request: Request) -> Response:
        data = [{"id": name, "object": "model", "owned_by": "cassette"} for name in cassette.models()]
        return _json(200, {"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return _json(200, {"status": "ok", "mode": config.mode, "entries": len(cassette.entries)})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/cassette/misses", misses, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.cassette = cassette
    return app


class CassetteServer:
    """A cassette served in a thread of this process; `api_root` is what a client's `base_url` is."""

    def __init__(self, server: ThreadedServer) -> None:
        self._server = server
        self.url = server.url
        self.api_root = f"{server.url}/v1"

    def misses(self) -> list[dict[str, Any]]:
        """The requests replay mode had no answer for (`GET /cassette/misses`)."""
        return httpx.get(f"{self.url}/cassette/misses", timeout=10).json()["misses"]

    def check_no_misses(self) -> None:
        """Fail (AssertionError listing their keys and models) when any request was missed."""
        missed = self.misses()
        if missed:
            listed = ", ".join(f"{miss['key']} (model {miss['request'].get('model')!r})" for miss in missed)
            raise AssertionError(f"{len(missed)} request(s) not in the cassette: {listed}")

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()


def start_cassette(config: CassetteConfig) -> CassetteServer:
    """Serve `config`'s cassette on `config.host:config.port` (port 0: a free one) in a thread."""
    uvicorn_config = server_config(create_cassette_app(config), host=config.host, port=config.port)
    return CassetteServer(ThreadedServer.start(uvicorn_config, name="cassette"))


def _json(status: int, body: Any) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    """OpenAI's error shape, which an OpenAI client shows as the message."""
    return _json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})


def _serve(config: CassetteConfig) -> int:
    import uvicorn

    from keraunos._uvicorn import run_until_signal

    server = uvicorn.Server(server_config(create_cassette_app(config), host=config.host, port=config.port))
    return 0 if run_until_signal(server) else 1


def main() -> None:
    """`python -m keraunos.testing.cassette`: serve a cassette until SIGTERM/SIGINT."""
    from keraunos._settings_cli import settings_command

    settings_command(
        CassetteConfig,
        name="cassette",
        doc="Serve recorded model calls over an OpenAI-compatible API: replay answers from the file "
        "(an unknown request is a 404 and listed at GET /cassette/misses); record forwards unknown "
        "requests to --upstream and appends them. Precedence: flag > environment variable > --config file.",
        run=_serve,
    )()


if __name__ == "__main__":
    main()
