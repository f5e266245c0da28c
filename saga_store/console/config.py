"""How the console is reached and who may use it.

The console binds 127.0.0.1 by default and then trusts whoever can reach the
port (that is, this machine's users). Any other bind needs a way to tell who
is asking: ``SAGA_CONSOLE_TOKEN`` (a bearer token, or the token typed into
the login form, which sets a signed cookie), or ``SAGA_CONSOLE_USER_HEADER``,
the header in which a reverse proxy that authenticated the user names them.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from saga_store import InvalidInput

MAX_NAME = 128


@dataclass(frozen=True)
class ConsoleConfig:
    """Settings of one console server.

    ``tokens`` maps each accepted token to the name recorded with the decisions
    of whoever presents it. ``operator`` is the name used when nothing else
    names the person (a loopback console with no token).
    """

    host: str = "127.0.0.1"
    port: int = 8765
    tokens: Mapping[str, str] = field(default_factory=dict)
    user_header: str | None = None
    operator: str = "operator"
    anchor_file: str | None = None
    page_size: int = 25
    live_block_ms: int = 5000  # how long one XREAD BLOCK of a live page waits
    # signs login cookies and CSRF tokens; new per process, so a restart logs out
    signing_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def from_env(cls, host: str = "127.0.0.1", port: int = 8765, operator: str | None = None,
                 env: Mapping[str, str] | None = None) -> ConsoleConfig:
        """Read ``SAGA_CONSOLE_TOKEN``, ``SAGA_CONSOLE_USER_HEADER``,
        ``SAGA_OPERATOR`` and ``SAGA_ANCHOR``; refuse an exposed bind with none
        of the first two."""
        env = os.environ if env is None else env
        name = operator or env.get("SAGA_OPERATOR") or _login_name()
        config = cls(host=host, port=port,
                     tokens=parse_tokens(env.get("SAGA_CONSOLE_TOKEN", ""), name),
                     user_header=(env.get("SAGA_CONSOLE_USER_HEADER") or "").strip() or None,
                     operator=check_name(name), anchor_file=env.get("SAGA_ANCHOR") or None)
        config.check_bind()
        return config

    @property
    def loopback(self) -> bool:
        """Whether the bind address only this machine can reach."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def open_access(self) -> bool:
        """No token and no proxy header: whoever reaches the port is the operator."""
        return not self.tokens and self.user_header is None

    def check_bind(self) -> None:
        if not self.loopback and self.open_access:
            raise InvalidInput(
                f"the console would listen on {self.host} with no authentication; set "
                "SAGA_CONSOLE_TOKEN (or SAGA_CONSOLE_USER_HEADER behind a reverse proxy that "
                "authenticates users), or bind 127.0.0.1", field="host")

    def token_name(self, presented: str) -> str | None:
        """The name of whoever holds ``presented``, compared in constant time."""
        found = None
        for token, name in self.tokens.items():
            if hmac.compare_digest(token.encode(), presented.encode()):
                found = name
        return found


def parse_tokens(text: str, default_name: str) -> dict[str, str]:
    """``SAGA_CONSOLE_TOKEN``: one token (its holder is ``default_name``), or
    comma-separated ``name:token`` pairs, one per operator."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, token = item.rpartition(":")
        name, token = (name.strip(), token.strip()) if sep else (default_name, item)
        if len(token) < 16:
            raise InvalidInput("SAGA_CONSOLE_TOKEN: each token needs at least 16 characters "
                               "(python3 -c 'import secrets; print(secrets.token_urlsafe())')",
                               field="SAGA_CONSOLE_TOKEN")
        out[token] = check_name(name or default_name)
    return out


def check_name(name: str) -> str:
    """A name fit to record as who decided: one line, 1-128 characters."""
    name = name.strip()
    if not name or len(name) > MAX_NAME or any(c in name for c in "\r\n"):
        raise InvalidInput(f"an operator name must be 1-{MAX_NAME} characters on one line",
                           field="operator")
    return name


def _login_name() -> str:
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"
