"""The gateway's redaction before commit (`--redaction-policy`, docs/lifecycle.md#redaction).

One `GatewayRedaction` per app holds the compiled policy and the app's metrics: the proxy's commit,
`POST .../events` and `PUT .../logs` pass what they are about to store through it, and it counts
each finding in `keraunos_redactions_total{rule, field}` (one audit entry per call would drown the
audit log; the policy's start-up entry says what was in force). Findings never hold the secret,
and nothing here logs a body; the one log line of the proxy that quotes a model server's answer
(an `--exact-tokens` refusal) quotes it redacted (`for_log`).
"""

from __future__ import annotations

from typing import Any

from keraunos.audit import AuditDraft
from keraunos.gateway.metrics import GatewayMetrics
from keraunos.protocol import MODEL_REQUEST
from keraunos.redaction import (
    CompiledPolicy,
    Finding,
    TextCache,
    redact_event_data,
    redact_model_request,
    redact_text,
)

#: `action` of the audit entry a gateway writes when it starts with a policy.
POLICY_ACTION = "redaction.policy"


class GatewayRedaction:
    """A compiled policy applied before commit, its findings counted in the app's metrics."""

    def __init__(self, policy: CompiledPolicy, metrics: GatewayMetrics) -> None:
        self.policy = policy
        self._metrics = metrics
        self._cache = TextCache()  # a conversation's earlier messages, scanned once

    def model_request(self, data: dict[str, Any]) -> dict[str, Any]:
        """`model_request` data as it may be stored (its ids removed when anything was found)."""
        redaction = redact_model_request(self.policy, data, self._cache)
        self._count(redaction.findings)
        return redaction.value

    def event(self, event_type: str, data: dict[str, Any]) -> dict[str, Any]:
        """Posted event data as it may be stored: a `model_request` (which only a key other than
        an agent token may post) as the proxy's own, any other as `event_data`."""
        if event_type == MODEL_REQUEST:
            return self.model_request(data)
        redaction = redact_event_data(self.policy, data)
        self._count(redaction.findings)
        return redaction.value

    def log(self, body: bytes) -> bytes:
        """An attempt log as it may be stored. Bytes that are not UTF-8 pass through unchanged
        (surrogate escapes), so a binary log is stored as it came, its text parts redacted."""
        text = body.decode("utf-8", errors="surrogateescape")
        redaction = redact_text(self.policy, "logs", text)
        if not redaction.findings:
            return body
        self._count(redaction.findings)
        return redaction.value.encode("utf-8", errors="surrogateescape")

    def for_log(self, body: bytes) -> bytes:
        """A model server's answer as the gateway's own log may quote it: redacted by the rules of
        the `response` field, uncounted (it is not stored in the ledger)."""
        text = body.decode("utf-8", errors="replace")
        return redact_text(self.policy, "response", text).value.encode("utf-8")

    def audit_draft(self, actor: str = "gateway") -> AuditDraft:
        """The audit entry of a gateway starting with this policy: its digest and rules (no secrets:
        a policy holds patterns, not values)."""
        policy = self.policy.policy
        return AuditDraft(
            actor=actor,
            action=POLICY_ACTION,
            subject="redaction:policy",
            after={"digest": policy.digest(), **policy.model_dump(mode="json")},
            reason="gateway started with --redaction-policy",
        )

    def _count(self, findings: tuple[Finding, ...]) -> None:
        for finding in findings:
            self._metrics.redacted(finding.rule, finding.field, finding.count)
