"""Settings, built once from the environment by the CLI and passed down."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Self

from saga_store.errors import InvalidInput
from saga_store.log import chain
from saga_store.log.layout import DEFAULT_BUCKETS, DEFAULT_VERSION, check_buckets, check_version


@dataclass(frozen=True)
class Settings:
    hmac_key: bytes | None = field(default=None, repr=False)
    max_event_bytes: int = 256 * 1024
    blob_threshold: int = 16 * 1024
    max_depth: int = 32
    dedupe_ttl_s: int = 7 * 24 * 3600
    lease_ms: int = 10_000
    policy_file: str | None = None  # approval policy (TOML or YAML); none: allow every call
    # a worker runs a plan's next step itself, claimed in the outcome's append,
    # instead of queueing it (off: every step goes through the queue)
    eager_steps: bool = True
    # how often workers and /metrics re-read whether Redis persists every write
    # (CONFIG SET appendonly no at run time needs no restart)
    durability_check_s: float = 30.0
    # a saga driven by its caller (``with store.saga(...)``) whose caller makes no
    # call and no keepalive for this long is taken for abandoned: the sweeper
    # aborts it and unwinds what ran
    client_lease_s: float = 300.0
    # while an MCP call waits for a person's approval, the gateway tells a client
    # that asked for progress (a progressToken) this often that it still waits,
    # so the client's request timeout does not end the call
    approval_progress_s: float = 10.0
    # how many ledger buckets a store gets when it is created (then recorded in
    # Redis: see saga_store.log.layout; later settings do not change it)
    buckets: int = DEFAULT_BUCKETS
    # the layout a store gets when it is created (SAGA_LAYOUT; recorded with the
    # buckets): 3 puts a saga's keys and its bucket's indexes under one hash tag
    layout: int = DEFAULT_VERSION
    # an append counts as done only once this many replicas hold it (Redis WAIT
    # right after it, on its connection); 0: when the master has it, as Redis
    # replicates asynchronously, so a failover can lose acknowledged appends
    wait_replicas: int = 0
    # how long an append waits for those replicas before it fails as not
    # confirmed (never 0: WAIT's 0 waits for ever)
    wait_timeout_ms: int = 1000

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> Self:
        e = os.environ if env is None else env
        values: dict[str, object] = {
            "hmac_key": chain.load_key(e.get("SAGA_HMAC_KEY"), e.get("SAGA_HMAC_KEY_FILE")),
            "policy_file": e.get("SAGA_POLICY_FILE") or None,
        }
        if e.get("SAGA_EAGER_STEPS"):
            values["eager_steps"] = _flag(e["SAGA_EAGER_STEPS"], "SAGA_EAGER_STEPS")
        for name, var in (("max_event_bytes", "SAGA_MAX_EVENT_BYTES"),
                          ("blob_threshold", "SAGA_BLOB_THRESHOLD"),
                          ("dedupe_ttl_s", "SAGA_DEDUPE_TTL"),
                          ("lease_ms", "SAGA_LEASE_MS")):
            if e.get(var):
                values[name] = int(e[var])
        if e.get("SAGA_DURABILITY_CHECK_S"):
            values["durability_check_s"] = _seconds(e["SAGA_DURABILITY_CHECK_S"],
                                                    "SAGA_DURABILITY_CHECK_S")
        if e.get("SAGA_CLIENT_LEASE_S"):
            values["client_lease_s"] = _seconds(e["SAGA_CLIENT_LEASE_S"], "SAGA_CLIENT_LEASE_S")
        if e.get("SAGA_APPROVAL_PROGRESS_S"):
            values["approval_progress_s"] = _seconds(e["SAGA_APPROVAL_PROGRESS_S"],
                                                     "SAGA_APPROVAL_PROGRESS_S")
        if e.get("SAGA_BUCKETS"):
            values["buckets"] = check_buckets(e["SAGA_BUCKETS"])
        if e.get("SAGA_LAYOUT"):
            values["layout"] = check_version(e["SAGA_LAYOUT"])
        if e.get("SAGA_WAIT_REPLICAS"):
            values["wait_replicas"] = _count(e["SAGA_WAIT_REPLICAS"], "SAGA_WAIT_REPLICAS",
                                             least=0, example=1)
        if e.get("SAGA_WAIT_TIMEOUT_MS"):
            values["wait_timeout_ms"] = _count(e["SAGA_WAIT_TIMEOUT_MS"], "SAGA_WAIT_TIMEOUT_MS",
                                               least=1, example=1000)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]  # checked at run time


def _flag(value: str, var: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise InvalidInput(f"{var}={value!r}: use 1 or 0 (true/false, yes/no, on/off)")


def _seconds(value: str, var: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):  # NaN fails too: a check must come round again
        raise InvalidInput(f"{var}={value!r}: use a number of seconds above 0, e.g. 30")
    return seconds


def _count(value: str, var: str, *, least: int, example: int) -> int:
    """A whole number of at least ``least`` (no sign, no fraction: ``1.5``
    replicas or ``-1`` ms has no meaning here)."""
    v = value.strip()
    if not (v.isascii() and v.isdigit()) or int(v) < least:
        raise InvalidInput(f"{var}={value!r}: use a whole number of at least {least}, "
                           f"e.g. {var}={example}")
    return int(v)
