"""Bearer-token authentication of the service's `/v1/*` routes.

The token is resolved once, when the service starts (`harnessrl serve` before Ray starts, then
each replica as it starts), from `HARNESSRL_API_TOKEN_FILE` (a file holding it, e.g. a mounted
Kubernetes Secret) or `HARNESSRL_API_TOKEN`. A configured token that is empty or unreadable is a
configuration error: the service refuses to start rather than run without authentication.
Neither variable set: the API is open (fine on 127.0.0.1, the default bind address).

Requests are checked by FastAPI's `HTTPBearer` (any header that is not `Bearer <credentials>`
is no credentials at all) and a constant-time comparison of bytes, so a malformed or non-ASCII
header is a 401 like a wrong token, never a server error.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer


_token: bytes | None = None  # this process's token (install); None: open
bearer = HTTPBearer(auto_error=False, description="the service's API token (HARNESSRL_API_TOKEN)")


def install(token: bytes | None) -> None:
    """The token this process's requests are checked against (called once, at start)."""
    global _token
    _token = token


def _raw(header_value: str) -> bytes:
    """The header's bytes as sent: ASGI servers decode header bytes as latin-1."""
    try:
        return header_value.encode("latin-1")
    except UnicodeEncodeError:
        return header_value.encode("utf-8", "replace")


async def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """401 unless the request carries the installed token. `async`: FastAPI runs a plain `def`
    dependency in a worker thread, a hop per request."""
    if _token is None:
        return
    if credentials is None or not hmac.compare_digest(_raw(credentials.credentials), _token):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
