"""Ids as URL path segments: percent-encoded, so that no id can change which route a request names.

An id is data chosen by whoever enqueued the rollout (a v1.0 server checks nothing): `..` would be
removed with the segment before it by any URL normaliser (`/api/rollouts/../attempt/1/heartbeat`
becomes `/api/attempt/1/heartbeat`), and `/`, `?`, `#` or `%` would end or reshape the path. Every
character outside the ones RFC 3986 allows in a segment is escaped, and a segment of dots only is
written with `%2E`; the gateway decodes it back to the id.
"""

from __future__ import annotations

from urllib.parse import quote

#: Characters RFC 3986 allows in a path segment besides letters, digits and `-._~` (minus `$`:
#: Kubernetes would expand `$(`).
_SAFE = ":@!&'()*+,;="


def path_segment(value: str) -> str:
    """`value` as one URL path segment that decodes back to it."""
    segment = quote(value, safe=_SAFE, errors="surrogatepass")
    return segment.replace(".", "%2E") if segment.strip(".") == "" else segment
