"""Redaction before commit (docs/lifecycle.md#redaction): a policy of rules, and pure functions that
apply it to one model call, one agent event or one attempt log.

The gateway loads a policy once (`load_policy`, from `--redaction-policy`) and redacts every
`model_request`, agent event and attempt log before the ledger sees it. Nothing here does I/O but
reading the policy file.
"""

from keraunos.redaction._detectors import DETECTORS, luhn_ok
from keraunos.redaction._policy import (
    FIELDS,
    MODEL_CALL_FIELDS,
    CompiledPolicy,
    RedactionField,
    RedactionPolicy,
    RedactionRule,
    compile_policy,
    load_policy,
)
from keraunos.redaction._redact import (
    Finding,
    Redaction,
    TextCache,
    redact_event_data,
    redact_model_request,
    redact_text,
)

__all__ = [
    "DETECTORS",
    "FIELDS",
    "MODEL_CALL_FIELDS",
    "CompiledPolicy",
    "Finding",
    "Redaction",
    "RedactionField",
    "RedactionPolicy",
    "RedactionRule",
    "TextCache",
    "compile_policy",
    "load_policy",
    "luhn_ok",
    "redact_event_data",
    "redact_model_request",
    "redact_text",
]
