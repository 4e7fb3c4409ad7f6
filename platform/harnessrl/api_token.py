"""The service's API token, resolved from the environment once, where the service starts.

`HARNESSRL_API_TOKEN_FILE` (a file holding the token, e.g. a mounted Kubernetes Secret) wins over
`HARNESSRL_API_TOKEN`. A configured token that is empty or unreadable is a configuration error: the
service refuses to start rather than run without authentication. In the core (standard library
only) so that the CLI's checks before Ray starts read it exactly as the service's replicas do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harnessrl.errors import ConfigError

TOKEN_ENV, TOKEN_FILE_ENV = "HARNESSRL_API_TOKEN", "HARNESSRL_API_TOKEN_FILE"


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
