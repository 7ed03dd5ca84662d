"""Kubernetes `Status` bodies and the exception that carries one out of a request handler."""

from __future__ import annotations

from typing import Any

#: The `reason` the real API server puts in a failure Status, by HTTP status code.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A request the stand-in refuses; `status()` is the body the real API server would send."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        """The `Status` object of this failure."""
        return failure_status(self.code, self.message, reason=self.reason, details=self.details)


def failure_status(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `kind: Status` failure body, shaped as the API server sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def success_status(details: dict[str, Any]) -> dict[str, Any]:
    """The `Status` a delete answers with when the object is gone at once."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


def not_found(group: str, plural: str, name: str) -> ApiError:
    """`jobs.batch "x" not found`, as the API server words it."""
    return ApiError(
        404,
        f'{qualified(group, plural)} "{name}" not found',
        details={"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    """`jobs.batch "x" already exists` (409, reason AlreadyExists)."""
    return ApiError(
        409,
        f'{qualified(group, plural)} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural},
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid: `causes` are (field, reason, message) as in the API server's field errors."""
    qualified_kind = f"{kind}.{group}" if group else kind
    listed = "; ".join(f"{field}: {message}" for field, _, message in causes)
    summary = listed if len(causes) == 1 else f"[{listed}]"
    return ApiError(
        422,
        f'{qualified_kind} "{name}" is invalid: {summary}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes],
        },
    )


def qualified(group: str, plural: str) -> str:
    """`jobs.batch` or `pods`: how error messages name a resource."""
    return f"{plural}.{group}" if group else plural
