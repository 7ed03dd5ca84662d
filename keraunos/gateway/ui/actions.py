"""The dashboard's actions, `POST /ui/api/releases/{release_id}/approve|abort|rollback`
(docs/protocol.md#dashboard): a person's release command from the releases view.

Each does exactly what the API's command route does (`api.releases.command_release`: the same
body, `expected_step`, answers and errors), for the session's actor, who is recorded in the audit
log as the API records a key's caller. Three checks come first, in this order: a session (401),
the dashboard's own page (`_guard.require_dashboard_page`, 403), and the grant the API would ask
of the session's key for the same call (`_roles.allows`, 403). Without auth on the gateway the
session is `ANONYMOUS`, which may do what the API lets anyone do.
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Depends, Request, Response
from starlette.exceptions import HTTPException

from keraunos.gateway._roles import ROLES, Role, allows
from keraunos.gateway.api.releases import ReleaseIdPath, command_release
from keraunos.gateway.ui._guard import PREFIX, require_dashboard_page, require_session
from keraunos.gateway.ui._session import Session
from keraunos.release.plan import COMMANDS, Command

router = APIRouter(prefix=f"{PREFIX}/api", tags=["dashboard"], include_in_schema=False)


def api_path(command: Command, release_id: str = "{release_id}") -> str:
    """The API route a dashboard action stands for."""
    return f"/api/releases/{release_id}/{command}"


def may(role: str, command: Command, release_id: str = "{release_id}") -> bool:
    """Whether a key of `role` may give `command` through the API (`_roles.allows`)."""
    return role in ROLES and allows(cast(Role, role), "POST", api_path(command, release_id), False)


def permitted_commands(role: str) -> list[Command]:
    """The release commands a session of `role` may give, in `COMMANDS` order."""
    return [command for command in COMMANDS if may(role, command)]


def _action_route(command: Command) -> None:
    """Register `POST /ui/api/releases/{release_id}/{command}`."""

    async def endpoint(
        request: Request,
        release_id: ReleaseIdPath,
        session: Annotated[Session, Depends(require_session)],
    ) -> Response:
        require_dashboard_page(request)
        if not may(session.role, command, release_id):
            roles = ", ".join(role for role in ROLES if may(role, command))
            raise HTTPException(
                status_code=403,
                detail=f"{session.actor} (role {session.role}) may not {command} a release: "
                f"log in with a key of one of the roles {roles}",
            )
        return await command_release(request, release_id, command, session.actor)

    endpoint.__name__ = f"ui_{command}_release"
    endpoint.__doc__ = f"`POST {api_path(command)}` for the dashboard's session."
    router.add_api_route(
        f"/releases/{{release_id}}/{command}", endpoint, methods=["POST"], summary=f"{command} a release"
    )


for _command in COMMANDS:
    _action_route(_command)
