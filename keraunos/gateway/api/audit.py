"""`GET /api/audit` (docs/protocol.md#audit): the hash-chained audit log, page by page.

Entries are served exactly as stored, so a client can check the chain itself
(`keraunos.audit.verify_chain`, `keraunos audit verify`) against the count and head hash the
ledger keeps beside it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from keraunos.audit import AuditEntry
from keraunos.gateway.api._common import json_response, ledger_of

router = APIRouter(prefix="/api", tags=["audit"])

#: Most entries one page may hold.
MAX_PAGE = 1000
#: Entry numbers are 64-bit integers in the ledger; a cursor beyond them is the caller's mistake.
_MAX_AFTER = 2**62


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
