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
import os
from collections.abc import Mapping
from pathlib import Path

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from harnessrl.errors import ConfigError

TOKEN_ENV, TOKEN_FILE_ENV = "HARNESSRL_API_TOKEN", "HARNESSRL_API_TOKEN_FILE"
_token: bytes | None = None  # this process's token (install); None: open
bearer = HTTPBearer(auto_error=False, description="the service's API token (HARNESSRL_API_TOKEN)")


def resolve_token(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The configured token as bytes, None when none is configured; ConfigError when one is
    configured but empty or unreadable. The file wins over the variable when both are set."""
    env = os.environ if environ is None else environ
    if TOKEN_FILE_ENV in env:
        path = env[TOKEN_FILE_ENV]
        if not path.strip():
            raise ConfigError(f"{TOKEN_FILE_ENV} is set but empty: give the token file's path, or unset it")
        try:
            token = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"{TOKEN_FILE_ENV}={path}: cannot read the token file ({exc.strerror or exc}); "
                              "refusing to serve without authentication") from None
        if not token:
            raise ConfigError(f"{TOKEN_FILE_ENV}={path}: the token file is empty; refusing to serve without "
                              "authentication")
        return token
    if TOKEN_ENV in env:
        token = env[TOKEN_ENV].strip().encode()
        if not token:
            raise ConfigError(f"{TOKEN_ENV} is set but empty; refusing to serve without authentication "
                              "(unset it to serve an open API)")
        return token
    return None


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
