"""The console's login: an API token entered once, a signed session cookie after that.

Why a cookie: the console's pages are rendered on the server, so the browser's own page loads
must carry the proof, and a browser adds an ``Authorization`` header to fetches only, never to
a link it follows. The cookie never holds the token: it holds ``<grant>.<expiry ms>.<sig>``,
``sig`` = HMAC-SHA256 over ``<grant>.<expiry>`` keyed by a key derived from the token that
granted it (the write or the read token). So

- every API process that has the same token accepts it (no session store, any replica);
- changing the token ends every session at once; a session ends by itself after
  :data:`SESSION_S` (12 h) or at logout (the cookie is dropped);
- it is ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (no other site's page
  can make the browser send it) and ``Secure`` when the console is served over HTTPS.

A cookie-authenticated request that changes something (POST) must also carry the header
``X-Jobwheel-Console: 1``, which the console's script sets and which another site's page
cannot (a cross-origin request with a custom header needs a CORS pre-flight this API never
grants): a second guard against cross-site requests, besides ``SameSite``.
"""

from __future__ import annotations

import hashlib
import hmac
import time

COOKIE = "jobwheel_console"
CSRF_HEADER = b"x-jobwheel-console"
SESSION_S = 12 * 3600
_CONTEXT = b"jobwheel-console-session\x00"


def _key(token: str) -> bytes:
    return hashlib.sha256(_CONTEXT + token.encode()).digest()


def _sig(token: str, body: str) -> str:
    return hmac.new(_key(token), body.encode(), hashlib.sha256).hexdigest()


def issue(grant: str, token: str, *, now_s: float | None = None) -> str:
    """The cookie value for a login with ``token`` (``grant`` "write" or "read")."""
    expires = int(((time.time() if now_s is None else now_s) + SESSION_S) * 1000)
    body = f"{grant}.{expires}"
    return f"{body}.{_sig(token, body)}"


def verify(
    value: str | None, *, write: str | None, read: str | None, now_s: float | None = None
) -> str | None:
    """The grant ("write" or "read") of a valid, unexpired cookie; None otherwise."""
    if not value:
        return None
    grant, _, rest = value.partition(".")
    expires, _, sig = rest.partition(".")
    token = write if grant == "write" else read if grant == "read" else None
    if token is None or not expires.isdigit() or len(sig) != 64:
        return None
    if not hmac.compare_digest(sig, _sig(token, f"{grant}.{expires}")):
        return None
    if int(expires) < (time.time() if now_s is None else now_s) * 1000:
        return None
    return grant


def cookie_from(scope: dict) -> str | None:
    """The session cookie's value from an ASGI scope's headers."""
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                if key == COOKIE:
                    return val
    return None


def has_csrf_header(scope: dict) -> bool:
    return any(name == CSRF_HEADER and value == b"1" for name, value in scope.get("headers", ()))
