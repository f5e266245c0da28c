"""Which gateways front the same data: the gateway id (``ss:gateway:{id}``).

Gateways with one id finish each other's sessions, compensating their calls
through their own downstream server, so two gateways may share an id only when
their servers reach the same data. The same command run in another directory,
or with another ``MEMORY_FILE_PATH`` or ``DATABASE_URL``, reaches other data,
so the default id covers the command, its working directory and the
environment the server is started with (a digest: values are never logged, nor
stored but as part of it); for a Streamable-HTTP server, its URL. A name given
with ``--gateway-id`` replaces all of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from saga_store.errors import InvalidInput
from saga_store.log.canonical import canonical

# set by a shell for each process it starts, never data a server reads
PER_LAUNCH = frozenset({"_", "SHLVL", "OLDPWD", "PWD"})


def gateway_id(command: list[str] | None, url: str | None, name: str | None = None, *,
               cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """A stable id for a downstream, so the next gateway finds what this one left:
    from the name given, else from the command with ``cwd`` and ``env`` (what the
    server is started in), or the URL.

        >>> gateway_id(None, "https://host/mcp") == gateway_id(None, "https://host/mcp")
        True
    """
    if name is not None:
        if not name.strip() or len(name) > 128 or any(c in name for c in "\r\n"):
            raise InvalidInput("--gateway-id must be a name of 1-128 characters on one line",
                               field="gateway_id")
        ident = canonical({"name": name})
    elif command is None:
        ident = canonical({"command": None, "url": url})
    else:
        ident = canonical({"command": command, "url": url, "cwd": cwd,
                           "env": {k: v for k, v in (env or {}).items()
                                   if k not in PER_LAUNCH}})
    return hashlib.sha256(ident).hexdigest()[:24]
