"""How the console is reached and who may use it.

The console binds 127.0.0.1 by default and then trusts whoever can reach the
port (that is, this machine's users). Any other bind needs a way to tell who
is asking: ``SAGA_CONSOLE_TOKEN`` (a bearer token, or the token typed into
the login form, which sets a signed cookie), or ``SAGA_CONSOLE_USER_HEADER``,
the header in which a reverse proxy that authenticated the user names them.
``SAGA_CONSOLE_READONLY_TOKEN`` tokens sign in those who may see everything
and change nothing: every action they send is refused with 403.

A console answers only requests addressed to a name it serves (the Host
header): loopback names, the address it binds, and the names given with
``--allowed-host`` / ``SAGA_CONSOLE_ALLOWED_HOSTS``. A page a browser loaded
from another site cannot reach a loopback console through DNS rebinding
(its own name made to resolve to 127.0.0.1): its requests still say the
attacker's name in Host, and no name but ours gets an answer.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from saga_store import InvalidInput

MAX_NAME = 128
# a console on loopback is reached by these names, on whatever port a tunnel forwards
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "")  # noqa: S104 (names to recognize, not to bind)


@dataclass(frozen=True)
class ConsoleConfig:
    """Settings of one console server.

    ``tokens`` maps each accepted token to the name recorded with the decisions
    of whoever presents it; ``readonly_tokens`` those of people who may look
    but not act. ``operator`` is the name used when nothing else
    names the person (a loopback console with no token).
    """

    host: str = "127.0.0.1"
    port: int = 8765
    tokens: Mapping[str, str] = field(default_factory=dict)
    readonly_tokens: Mapping[str, str] = field(default_factory=dict)
    user_header: str | None = None
    operator: str = "operator"
    anchor_file: str | None = None
    # Host names (optionally ``name:port``) served besides loopback and the bind address
    allowed_hosts: tuple[str, ...] = ()
    page_size: int = 25
    live_block_ms: int = 5000  # how long one XREAD BLOCK of a live page waits
    keepalive_s: float = 10.0  # a quiet live feed sends a comment this often
    # signs login cookies and CSRF tokens; new per process, so a restart logs out
    signing_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def from_env(cls, host: str = "127.0.0.1", port: int = 8765, operator: str | None = None,
                 env: Mapping[str, str] | None = None,
                 allowed_hosts: tuple[str, ...] = ()) -> ConsoleConfig:
        """Read ``SAGA_CONSOLE_TOKEN``, ``SAGA_CONSOLE_READONLY_TOKEN``,
        ``SAGA_CONSOLE_USER_HEADER``,
        ``SAGA_OPERATOR``, ``SAGA_ANCHOR`` and ``SAGA_CONSOLE_ALLOWED_HOSTS``
        (comma-separated, added to ``allowed_hosts``); refuse an exposed bind
        with neither a token nor a user header."""
        env = os.environ if env is None else env
        name = operator or env.get("SAGA_OPERATOR") or _login_name()
        extra = [h for h in env.get("SAGA_CONSOLE_ALLOWED_HOSTS", "").split(",") if h.strip()]
        config = cls(host=host, port=port,
                     tokens=parse_tokens(env.get("SAGA_CONSOLE_TOKEN", ""), name),
                     readonly_tokens=parse_tokens(env.get("SAGA_CONSOLE_READONLY_TOKEN", ""),
                                                  "viewer", "SAGA_CONSOLE_READONLY_TOKEN"),
                     user_header=(env.get("SAGA_CONSOLE_USER_HEADER") or "").strip() or None,
                     operator=check_name(name), anchor_file=env.get("SAGA_ANCHOR") or None,
                     allowed_hosts=tuple(check_host(h) for h in (*allowed_hosts, *extra)))
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
        return not self.tokens and not self.readonly_tokens and self.user_header is None

    def check_bind(self) -> None:
        if not self.loopback and self.open_access:
            raise InvalidInput(
                f"the console would listen on {self.host} with no authentication; set "
                "SAGA_CONSOLE_TOKEN (or SAGA_CONSOLE_USER_HEADER behind a reverse proxy that "
                "authenticates users), or bind 127.0.0.1", field="host")

    @cached_property
    def served_hosts(self) -> frozenset[tuple[str, int | None]]:
        """``(name, port)`` pairs a request's Host may name; port None: any port."""
        served: set[tuple[str, int | None]] = {(name, None) for name in LOOPBACK_HOSTS}
        bind = self.host.strip("[]").lower()
        if bind not in WILDCARD_BINDS and not self.loopback:
            served.add((_bracketed(bind), self.port))
        for entry in self.allowed_hosts:
            parsed = split_host(check_host(entry))
            if parsed is not None:
                served.add(parsed)
        return frozenset(served)

    def serves(self, host: str | None) -> bool:
        """Whether ``host`` (a Host header, or an Origin's ``name[:port]``) names this
        console. An entry with a port matches that port only; one without, any."""
        parsed = split_host(host or "")
        if parsed is None:
            return False
        name, port = parsed
        return (name, None) in self.served_hosts or \
            (port is not None and (name, port) in self.served_hosts)

    @property
    def token_login(self) -> bool:
        """Whether people sign in with a token."""
        return bool(self.tokens or self.readonly_tokens)

    def token_name(self, presented: str) -> str | None:
        """The name of whoever holds ``presented``, compared in constant time."""
        found = self.token_holder(presented)
        return found[0] if found else None

    def token_holder(self, presented: str) -> tuple[str, bool] | None:
        """``(name, read_only)`` of whoever holds ``presented``; every token is
        compared, in constant time."""
        found = None
        for tokens, read_only in ((self.tokens, False), (self.readonly_tokens, True)):
            for token, name in tokens.items():
                if hmac.compare_digest(token.encode(), presented.encode()):
                    found = (name, read_only)
        return found


def parse_tokens(text: str, default_name: str,
                 variable: str = "SAGA_CONSOLE_TOKEN") -> dict[str, str]:
    """``SAGA_CONSOLE_TOKEN``: one token (its holder is ``default_name``), or
    comma-separated ``name:token`` pairs, one per operator."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, token = item.rpartition(":")
        name, token = (name.strip(), token.strip()) if sep else (default_name, item)
        if len(token) < 16:
            raise InvalidInput(f"{variable}: each token needs at least 16 characters "
                               "(python3 -c 'import secrets; print(secrets.token_urlsafe())')",
                               field=variable)
        out[token] = check_name(name or default_name)
    return out


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a Host header (``name``, ``name:port``, ``[v6]:port``),
    the name lower-cased without a trailing dot; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name += "]"
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:  # a bare IPv6 address, as a bind address is written
        name, port_text = _bracketed(value), None
    else:
        name, sep, port_text_ = value.partition(":")
        port_text = port_text_ if sep else None
    name = name.rstrip(".")
    if not name or any(c in name for c in "/@?# \t\\"):
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def check_host(entry: str) -> str:
    """An ``--allowed-host`` entry: a host name or address, optionally ``:port``."""
    entry = entry.strip()
    if split_host(entry) is None or "://" in entry:
        raise InvalidInput(f"allowed host {entry[:80]!r}: give the name the console is reached "
                           "by, optionally with :port (e.g. console.example.com or "
                           "console.example.com:443), not a URL", field="allowed_host")
    return entry


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


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
