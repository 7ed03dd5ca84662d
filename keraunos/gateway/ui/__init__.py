"""The web dashboard at `/ui` (docs/dashboard.md): pages, data routes and their guard, in the gateway.

`pages` serves the page, its static files, login and logout; `api` the JSON it draws from; `views`
shapes rollouts for it (pure), decoding ids with a `keraunos._tokenizer_file.TokenizerFile` when one is set;
`actions` takes a release's approve, abort and rollback from its page, each only for a role that
may; `_session` and `_guard` keep it to logged-in readers.
"""

from __future__ import annotations

from keraunos.gateway.ui._guard import SecurityHeaders
from keraunos.gateway.ui._session import session_key
from keraunos.gateway.ui.api import ViewCache

__all__ = ["SecurityHeaders", "ViewCache", "session_key"]
