"""`keraunos engine-mock`: a command whose options are the fields of `EngineConfig`, plus `--config`,
and serving the engine stand-in with uvicorn until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio

import typer

from keraunos._settings_cli import settings_command
from keraunos.testing._engine_config import EngineConfig


def engine_mock_app() -> typer.Typer:
    """A one-command typer app that validates its options through `EngineConfig` and serves."""
    return settings_command(
        EngineConfig,
        name="engine-mock",
        doc="Run a vLLM-compatible OpenAI model server stand-in, for testing an agent (or the gateway, or a "
        "benchmark) without a GPU or a model: deterministic "
        "tokens and log probabilities, vLLM's response and streaming shapes, configurable latency and "
        "injected failures. Runtime control: POST /mock/faults, POST /mock/reset, GET /mock/stats. "
        "Precedence: flag > environment variable > --config file > default.",
        run=serve_engine,
    )


def serve_engine(config: EngineConfig) -> int:
    """Serve the engine stand-in with uvicorn (httptools, uvloop when installed) until SIGTERM/SIGINT."""
    import uvicorn

    from keraunos._logging import configure_logging
    from keraunos._uvicorn import server_config
    from keraunos.testing.engine import create_engine_app

    try:
        import uvloop
    except ImportError:  # no Windows build; the standard loop works, only slower
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop

    configure_logging(config.log_level)
    _keep_freed_memory()
    server = uvicorn.Server(
        server_config(
            create_engine_app(config),
            host=config.host,
            port=config.port,
            http="httptools",
            loop="none",
            lifespan="off",
            log_level=config.log_level,
            timeout_keep_alive=120,
            backlog=4096,
        )
    )
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(server.serve())
    return 0 if server.started else 1


def _keep_freed_memory() -> None:
    """Let glibc keep freed heap instead of trimming it back to the OS after every large request.

    Each request allocates and frees bodies of tens of kilobytes; glibc's default trimming turns
    that into brk/mmap system calls, which cost a third of the request under sandboxed kernels.
    A no-op where the C library has no `mallopt` (macOS, musl).
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    mallopt(m_trim_threshold, 256 << 20)
    mallopt(m_top_pad, 64 << 20)
    mallopt(m_mmap_threshold, 32 << 20)


# -- ASGI plumbing ---------------------------------------------------------------------------------
