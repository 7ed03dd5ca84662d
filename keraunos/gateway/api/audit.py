"""`GET /api/audit` and `POST /api/audit` (docs/protocol.md#audit): the hash-chained audit log,
page by page, and the entries clients append to it.

Entries are served exactly as stored, so a client can check the chain itself
(`keraunos.audit.verify_chain`, `keraunos audit verify`) against the count and head hash the
ledger keeps beside it. A client appends only actions of a client namespace (`optimize.call`):
the gateway's own actions (`resource.push`, `label.move`, `release.*`) are written by the ledger in
the transaction of their change, and an entry posted under one of their names would be a forgery.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.exceptions import HTTPException

from keraunos.audit import AuditDraft, AuditEntry
from keraunos.gateway._auth import actor_of
from keraunos.gateway.api._common import json_body_doc, json_response, ledger_of, read_body
from keraunos.resources import MAX_MESSAGE_CHARS

router = APIRouter(prefix="/api", tags=["audit"])

#: Most entries one page may hold.
MAX_PAGE = 1000
#: Entry numbers are 64-bit integers in the ledger; a cursor beyond them is the caller's mistake.
_MAX_AFTER = 2**62

#: The namespaces a client may append actions in; every other action is the gateway's own.
CLIENT_NAMESPACES = ("optimize", "client")
#: A dotted action in a client namespace: `optimize.call`, `client.note.added`.
ACTION_PATTERN = rf"^({'|'.join(CLIENT_NAMESPACES)})(\.[a-z][a-z0-9_]*)+$"
#: Largest `evidence` a client may append, as compact JSON (a recorded model call with its messages).
MAX_EVIDENCE_BYTES = 256 * 1024


class AuditPage(BaseModel):
    """One page of the audit log and the ledger's count and head hash, read after the page (so
    they are never behind it)."""

    items: list[AuditEntry]
    count: int
    head: str


@router.get(
    "/audit",
    summary="Audit log entries after a number, with the ledger's entry count and head hash",
    response_model=None,
    responses={200: {"model": AuditPage, "description": "Entries after+1 .. after+limit, in order."}},
)
async def list_audit(
    request: Request,
    after: Annotated[int, Query(ge=0, le=_MAX_AFTER, description="Continue after this entry number.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Most entries to return.")] = 100,
) -> Response:
    """Entries numbered `after+1 .. after+limit` in order; pass the last `seq` back as `after`."""
    ledger = ledger_of(request)
    items = await ledger.list_audit(after, limit)
    head = await ledger.audit_head()
    page = AuditPage(items=items, count=head.count, head=head.head)
    return json_response(page.model_dump_json().encode())


class AuditAppend(BaseModel):
    """Body of `POST /api/audit`: one action a client took, in a client namespace (`optimize.call`),
    what it acted on, why, and the evidence (a recorded model call: its messages, reply, usage)."""

    model_config = ConfigDict(extra="forbid")

    action: str = Field(
        pattern=ACTION_PATTERN,
        max_length=128,
        description=f"A dotted verb in a client namespace ({', '.join(n + '.' for n in CLIENT_NAMESPACES)}).",
    )
    subject: str = Field(default="", max_length=256)
    reason: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    evidence: dict[str, Any] | None = None


_APPEND_BODY = TypeAdapter(AuditAppend)


@router.post(
    "/audit",
    summary="Append a client's action to the audit log (client namespaces only)",
    response_model=None,
    status_code=201,
    responses={
        201: {"model": AuditEntry, "description": "The entry as stored: numbered, stamped, chained."},
        413: {"description": f"`evidence` is over {MAX_EVIDENCE_BYTES} bytes as JSON."},
    },
    openapi_extra=json_body_doc("AuditAppend"),
)
async def append_audit(request: Request) -> Response:
    """Append one entry with the caller as `actor`; the ledger numbers, stamps and chains it."""
    body = await read_body(request, _APPEND_BODY)
    _check_evidence(body.evidence)
    draft = AuditDraft(
        actor=actor_of(request.scope),
        action=body.action,
        subject=body.subject,
        evidence=body.evidence,
        reason=body.reason,
    )
    entry = await ledger_of(request).append_audit(draft, time.time())
    return json_response(entry.model_dump_json().encode(), 201)


def _check_evidence(evidence: dict[str, Any] | None) -> None:
    """413 for evidence over `MAX_EVIDENCE_BYTES`; 422 for evidence the chain could not hash back
    exactly (NaN, Infinity, integers beyond 64 bits: the entry's hash is over orjson's JSON, which
    writes NaN as null and refuses big integers, so `keraunos audit verify` would fail on it)."""
    if evidence is None:
        return
    try:
        dumped = orjson.dumps(evidence)
    except orjson.JSONEncodeError:
        dumped = b""
    if not dumped or orjson.loads(dumped) != evidence:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", "evidence"),
                    "msg": "evidence must be plain JSON: no NaN or Infinity, integers within 64 bits",
                    "input": None,
                }
            ]
        )
    if len(dumped) > MAX_EVIDENCE_BYTES:
        raise HTTPException(
            413,
            f"evidence is {len(dumped)} bytes as JSON; the limit is {MAX_EVIDENCE_BYTES} (MAX_EVIDENCE_BYTES)",
        )
