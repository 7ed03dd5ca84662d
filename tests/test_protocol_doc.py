"""docs/protocol.md names every route the gateway serves, and every citation of it names a section.

The contract lives in the repository and must stay true as routes are added: each route has a
heading `### METHOD /path/template` in docs/protocol.md, and the routes of the app that
`keraunos.gateway.app.create_app` builds are compared with those headings both ways. Source
comments cite the contract as `docs/protocol.md#<section>`; every such anchor must exist.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path

import fastapi.routing
import pytest
from fastapi import FastAPI, Response

from keraunos.gateway.app import create_app
from keraunos.gateway.config import GatewayConfig
from keraunos.ledger import open_ledger

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "protocol.md"

#: A route heading: `### POST /api/rollouts/claim` (any heading level from 2 to 4).
_ROUTE_HEADING = re.compile(r"^#{2,4} (GET|POST|PUT|PATCH|DELETE) (/\S*)\s*$", re.MULTILINE)
#: Starlette's typed path parameters (`{path:path}`): the document writes them as `{path}`.
_CONVERTER = re.compile(r"\{(\w+):\w+\}")
#: Where the contract is cited from, and how: `docs/protocol.md#rollouts`, `protocol.md#proxy`.
_CITED_FROM = ("keraunos", "tests", "docs", "benchmarks", "examples", "README.md")
_CITATION = re.compile(r"protocol\.md#([A-Za-z0-9_-]+)")
#: The contract's old name, outside the repository; nothing may cite it any more.
_OLD_NAME = "PROTOCOL" + ".md"


def documented_routes(markdown: str) -> set[str]:
    """`METHOD /path` of every route heading in `markdown`."""
    return {f"{method} {path}" for method, path in _ROUTE_HEADING.findall(markdown)}


def served_routes(app: FastAPI, documented: Iterable[str] = ()) -> set[str]:
    """`METHOD /path` of every route `app` serves, path parameters written `{name}`.

    FastAPI's own documentation routes (`/docs`, `/redoc`, `/openapi.json`, the OAuth redirect) are
    left out unless `documented` names them; HEAD, which Starlette adds to GET routes, is left out.
    A route without methods (a mount, a websocket) fails the test: extend this function and the
    document for it.
    """
    framework = {
        path
        for path in (app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url)
        if path
    }
    documented = set(documented)
    routes: set[str] = set()
    for path, methods in _route_table(app):
        if not methods:
            raise AssertionError(
                f"cannot compare the route {path!r}, which has no HTTP methods, with the document"
            )
        template = _CONVERTER.sub(r"{\1}", path)
        for method in sorted(set(methods) - {"HEAD"}):
            name = f"{method} {template}"
            if path in framework and name not in documented:
                continue
            routes.add(name)
    return routes


def _route_table(app: FastAPI) -> list[tuple[str, Collection[str] | None]]:
    """(path, methods) of every route of `app`, included routers flattened.

    FastAPI 0.16x keeps included routers as one entry each and flattens them with
    `iter_route_contexts`; older versions copy their routes into `app.routes`.
    """
    iterate = getattr(fastapi.routing, "iter_route_contexts", None)
    if iterate is not None:
        return [(context.path, context.methods) for context in iterate(app.routes)]
    return [(getattr(route, "path", repr(route)), getattr(route, "methods", None)) for route in app.routes]


def route_differences(app: FastAPI, markdown: str) -> tuple[list[str], list[str]]:
    """(served but not named in `markdown`, named but not served), each sorted."""
    documented = documented_routes(markdown)
    served = served_routes(app, documented)
    return sorted(served - documented), sorted(documented - served)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown`: lower case, punctuation dropped,
    spaces as hyphens, `-1`, `-2`, ... after repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    # The routes depend on the code, not on the ledger's contents: the ledger is never opened.
    ledger = open_ledger(str(tmp_path_factory.mktemp("protocol-doc") / "ledger.db"))
    return create_app(GatewayConfig(key="protocol-doc-key"), ledger)


def test_every_route_the_gateway_serves_has_a_heading_in_docs_protocol_md_and_every_heading_is_served(
    app: FastAPI,
) -> None:
    unnamed, absent = route_differences(app, PROTOCOL.read_text())
    message = []
    if unnamed:
        message.append(
            "routes the gateway serves that docs/protocol.md does not name (add a heading "
            "`### METHOD /path` for each, and say what it does):\n  " + "\n  ".join(unnamed)
        )
    if absent:
        message.append(
            "docs/protocol.md names routes the gateway does not serve (remove or correct the "
            "heading):\n  " + "\n  ".join(absent)
        )
    assert not message, "\n".join(message)


def test_a_route_added_to_the_app_without_a_heading_is_reported_by_name(tmp_path: Path) -> None:
    app = create_app(GatewayConfig(key="k"), open_ledger(str(tmp_path / "ledger.db")))

    async def extra() -> Response:
        return Response(b"{}")

    app.add_api_route("/api/rollouts/{rollout_id}/extra/{rest:path}", extra, methods=["GET", "POST"])
    unnamed, absent = route_differences(app, PROTOCOL.read_text())
    assert unnamed == [
        "GET /api/rollouts/{rollout_id}/extra/{rest}",
        "POST /api/rollouts/{rollout_id}/extra/{rest}",
    ]
    assert absent == []


def test_a_heading_naming_no_served_route_is_reported(app: FastAPI) -> None:
    markdown = PROTOCOL.read_text() + "\n### DELETE /api/rollouts\n\nDeletes everything.\n"
    unnamed, absent = route_differences(app, markdown)
    assert (unnamed, absent) == ([], ["DELETE /api/rollouts"])


def test_framework_documentation_routes_need_no_heading_unless_the_document_names_them(app: FastAPI) -> None:
    assert "GET /openapi.json" not in served_routes(app)
    assert "GET /openapi.json" in served_routes(app, ["GET /openapi.json"])


def test_every_citation_of_the_contract_names_an_existing_section_of_docs_protocol_md() -> None:
    known = anchors(PROTOCOL.read_text())
    broken: list[str] = []
    stale: list[str] = []
    for path in _cited_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            broken += [f"{where}: #{anchor}" for anchor in _CITATION.findall(line) if anchor not in known]
            if _OLD_NAME in line and path != Path(__file__).resolve():
                stale.append(f"{where}: {line.strip()}")
    assert not broken, "citations of docs/protocol.md whose section does not exist:\n  " + "\n  ".join(broken)
    assert not stale, (
        f"{_OLD_NAME} is not in the repository; cite docs/protocol.md#<section> instead:\n  "
        + "\n  ".join(stale)
    )


def test_github_anchors_are_derived_as_github_derives_them() -> None:
    markdown = (
        "# The contract\n## Pause and drain\n```\n# not a heading\n```\n### GET /api/info\n## Ids\n## Ids\n"
    )
    assert anchors(markdown) == {"the-contract", "pause-and-drain", "get-apiinfo", "ids", "ids-1"}


def _cited_files() -> list[Path]:
    files: list[Path] = []
    for name in _CITED_FROM:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in (".py", ".md", ".yaml", ".yml", ".toml") and "__pycache__" not in p.parts
            ]
    return files
