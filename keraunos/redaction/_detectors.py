"""The named detectors a redaction rule may use instead of its own regular expression (pure).

Each detector is a compiled pattern and, where a shape alone matches too much, a check on the
matched text (a card number must pass the Luhn check, a phone number needs 7 to 15 digits and a
separator). A pattern with a group named `secret` redacts only that group: `token=abc...` keeps
`token=` so the redacted text still says what was there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

DetectorName = str


@dataclass(frozen=True, slots=True)
class Detector:
    """A pattern, and a check the matched span must pass to count (None: every match counts)."""

    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None


def luhn_ok(text: str) -> bool:
    """Whether the digits of `text` (13 to 19 of them) pass the Luhn check of card numbers."""
    digits = [int(c) for c in text if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _phone_ok(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    if not 7 <= digits <= 15:
        return False
    # A bare run of digits is a count or an id as often as a phone number; a dotted quad is an address.
    if _IPV4.fullmatch(text) or _DATE.fullmatch(text):
        return False
    return text.startswith("+") or any(c in text for c in " -.()")


def _key_ok(text: str) -> bool:
    # After `key=` a word of 16 letters is prose as often as not; a secret mixes letters and digits.
    if text.startswith(_KEY_PREFIXES):
        return True
    return any(c.isdigit() for c in text) and any(c.isalpha() for c in text)


_KEY_PREFIXES = ("sk-", "AKIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xox")
_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{4}")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)")

DETECTORS: dict[DetectorName, Detector] = {
    "email": Detector(re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    "phone": Detector(
        re.compile(
            r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}(?![\w])"
        ),
        _phone_ok,
    ),
    "api_key": Detector(
        re.compile(
            r"(?<![\w-])(?P<secret>sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
            r"|xox[abprs]-[A-Za-z0-9-]{10,})(?![\w-])"
            r"|(?i:\b(?:api[_-]?key|key|token|secret|password|passwd)\s*[=:]\s*[\"']?)"
            r"(?P<value>[A-Za-z0-9+/_-]{16,}={0,2})"
        ),
        _key_ok,
    ),
    "credit_card": Detector(re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), luhn_ok),
    "ipv4": Detector(_IPV4),
}


def secret_span(match: re.Match[str]) -> tuple[int, int]:
    """The span of `match` to redact: its `secret` or `value` group when it has one that matched,
    else the whole match."""
    for group in ("secret", "value"):
        if group in match.re.groupindex and match.start(group) >= 0:
            return match.span(group)
    return match.span()
