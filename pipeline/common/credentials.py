"""Secrets in URLs: kept out of every message, param and log, and sent the way the servers expect.

A `scheme://user:password@host/...` URL carries its secret into everything that prints or stores
the URL (error messages, MLflow params, dataset sources, DVC's lock file). So:

- `redact` masks the user-info part of every URL in a text; stages pass each message through it;
- `split_user_info` takes the secret out of a URL, so the rest of the program only sees the bare URL;
- `basic_auth_header` builds the HTTP Basic `Authorization` header from a user name and password
  (what MLflow sends for MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD);
- `netrc_credentials` reads `~/.netrc` (or $NETRC), where curl, pip and requests look for them too.

Torch-free and MLflow-free: the validate stage and the error path import it.
"""

from __future__ import annotations

import base64
import netrc
import os
import re
import urllib.parse
from pathlib import Path

MASK = "***"
# scheme://user-info@ — user-info runs to the last '@' before the host's path (a password may hold an
# unescaped '@'), never across a '/' or whitespace, so a path's or a sentence's '@' is not taken for it.
_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user_info>[^/\s'\"]+)@")


def redact(text: str) -> str:
    """`text` with the user-info of every URL in it replaced by `***` (`https://***@host/`)."""
    return _USER_INFO.sub(lambda match: f"{match['scheme']}{MASK}@", text)


def has_user_info(url: str) -> bool:
    return bool(_USER_INFO.search(url))


def split_user_info(url: str) -> tuple[str, str | None, str | None]:
    """(`url` without user-info, user name, password); the user name and password are URL-decoded."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return bare, user, password


def basic_auth_header(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def netrc_credentials(url: str) -> tuple[str, str] | None:
    """(login, password) for `url`'s host from $NETRC or ~/.netrc; None when there is no entry.

    A netrc file that cannot be parsed is ignored here (the request then goes without credentials
    and a server that needs them answers 401, which the caller reports).
    """
    host = urllib.parse.urlsplit(url).hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if not host or not path.is_file():
        return None
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError, UnicodeDecodeError):
        return None
    if entry is None:
        return None
    login, _account, password = entry
    return login, password or ""
