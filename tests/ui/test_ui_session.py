"""The dashboard's session cookie and same-origin check (pure, `keraunos.gateway.ui._session` and
`_guard`): a session names who logged in and expires; a forged, extended or foreign-signed cookie,
or one of a key since removed, is no session; a cross-site state change is told apart."""

from __future__ import annotations

from keraunos.gateway.ui._guard import same_origin
from keraunos.gateway.ui._session import SESSION_SECONDS, issue, session_key, verify

KEY = session_key(b"the gateway's token secret")
NAMES = frozenset({"reader-1"})


def test_a_session_names_who_logged_in_until_it_expires() -> None:
    cookie = issue(KEY, "key:reader-1", "reader", now=1000.0)
    session = verify(KEY, cookie, 1000.0 + SESSION_SECONDS - 1, NAMES, server_key=True)
    assert session is not None and (session.actor, session.role) == ("key:reader-1", "reader")
    assert verify(KEY, cookie, 1000.0 + SESSION_SECONDS, NAMES, server_key=True) is None


def test_a_changed_payload_or_another_secret_is_no_session() -> None:
    cookie = issue(KEY, "key:reader-1", "reader", now=1000.0)
    payload, signature = cookie.split(".")
    forged = issue(session_key(b"another secret"), "server-key", "admin", now=1000.0).split(".")[0]
    assert verify(KEY, f"{forged}.{signature}", 1000.0, NAMES, server_key=True) is None
    assert verify(session_key(b"another secret"), cookie, 1000.0, NAMES, server_key=True) is None
    for broken in ("", "x", cookie + ".x", f"{payload}.", "a" * 5000):
        assert verify(KEY, broken, 1000.0, NAMES, server_key=True) is None


def test_a_session_ends_with_its_key() -> None:
    cookie = issue(KEY, "key:reader-1", "reader", now=1000.0)
    assert verify(KEY, cookie, 1000.0, frozenset(), server_key=True) is None
    server = issue(KEY, "server-key", "admin", now=1000.0)
    assert verify(KEY, server, 1000.0, NAMES, server_key=False) is None


def test_the_cookie_holds_no_key() -> None:
    assert "reader-key" not in issue(KEY, "key:reader-1", "reader", now=1000.0)


def test_same_origin_tells_cross_site_requests_apart() -> None:
    host, scheme = "127.0.0.1:8000", "http"
    assert same_origin([("Sec-Fetch-Site", "same-origin")], host, scheme)
    assert same_origin([("Sec-Fetch-Site", "none")], host, scheme)
    assert not same_origin(
        [("Sec-Fetch-Site", "cross-site"), ("Origin", "http://127.0.0.1:8000")], host, scheme
    )
    assert not same_origin([("Sec-Fetch-Site", "same-site")], host, scheme)
    assert same_origin([("Origin", "http://127.0.0.1:8000")], host, scheme)
    assert not same_origin([("Origin", "http://127.0.0.1:8001")], host, scheme)
    assert same_origin([], host, scheme)  # not a browser: curl, a script
