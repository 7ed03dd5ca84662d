"""Entry point of a local Python agent: `python -m keraunos.controller._agent_main module:Class`.

Imports the class (`module:Class` or `module.Class`), instantiates it without arguments and calls
`run()`, awaiting it when it is a coroutine. Exit status: 0 when `run()` returns, 1 when it raises
(traceback on stderr, which the runner keeps in the attempt's log), 2 when the class cannot be
loaded. Only the standard library is imported before the agent's own module.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import traceback

from keraunos.errors import KeraunosError


class AgentLoadError(KeraunosError):
    """The agent class named on the command line cannot be imported or is not a class."""


def load_agent_class(spec: str) -> type:
    """The class named by `module:Class` (or `module.Class`); raises `AgentLoadError` saying why not."""
    module_name, sep, class_name = spec.partition(":")
    if not sep:
        module_name, _, class_name = spec.rpartition(".")
    if not module_name or not class_name:
        raise AgentLoadError(f"agent class {spec!r} is not of the form 'module:Class' or 'module.Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentLoadError(f"cannot import module {module_name!r} of agent class {spec!r}: {exc}") from exc
    loaded = getattr(module, class_name, None)
    if not isinstance(loaded, type):
        raise AgentLoadError(f"module {module_name!r} has no class {class_name!r} (agent class {spec!r})")
    return loaded


def run_agent(spec: str) -> int:
    """Load and run the agent class `spec`; the process exit status."""
    try:
        agent_class = load_agent_class(spec)
    except AgentLoadError as exc:
        if exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = agent_class().run()
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))
    except Exception:
        traceback.print_exc()
        return 1
    return 0


async def _awaited(awaitable: object) -> None:
    await awaitable  # type: ignore[misc]


def main(argv: list[str]) -> int:
    """`argv[1]` is the agent class; anything else is a usage error (status 2)."""
    if len(argv) != 2:
        print("usage: python -m keraunos.controller._agent_main module:Class", file=sys.stderr)
        return 2
    return run_agent(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
