"""The Lua scripts, one ``.lua`` file each in ``saga_store/lua/`` with its KEYS
and ARGV contract at the top. Read once per process; every script touches
the keys of one hash tag (one Cluster slot).

    append.lua           compare-and-set a chain's head, lease and phase checks
    claim.lua            claim an idempotency key
    fence_lease.lua      keep a worker's lease while it works, or say it is lost
    heartbeat.lua        note a worker's heartbeat by Redis's clock
    ledger_cut.lua       drop a ledger chain's archived prefix, recording its base
    release_lease.lua    expire a lease if the token still holds it
    renew_lease.lua      extend a held lease, or retake it if it lapsed
    schedule.lua         put a saga in an index of sagas in flight, by Redis's clock
    take_over_lease.lua  take a lease from a holder known to be gone
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

from redis.exceptions import NoScriptError


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


APPEND = source("append")
CLAIM = source("claim")
FENCE_LEASE = source("fence_lease")
HEARTBEAT = source("heartbeat")
RELEASE_LEASE = source("release_lease")
RENEW_LEASE = source("renew_lease")
SCHEDULE = source("schedule")
TAKE_OVER_LEASE = source("take_over_lease")


class Scripts:
    """Registers the append script once per client; calls go by SHA (EVALSHA)."""

    def __init__(self, redis: Any) -> None:
        self.append = redis.register_script(APPEND)

    def call_append(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA straight on a connection (redis-py's Script wrapper costs about
        as much as the script itself); loads the script if Redis lost it."""
        try:
            return client.execute_command("EVALSHA", self.append.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.append.sha = client.script_load(APPEND)
            return client.execute_command("EVALSHA", self.append.sha, len(keys), *keys, *args)
