"""Secret tool arguments: kept out of the log, covered by it through a digest.

The log keeps ``{"$secret": sha256(salt || canonical(value))}``; the value
lives in ``ss:{S}:secrets`` (field = step) until the saga closes or the dedupe
retention passes. The salt is per saga and stored beside the values, so once
they are gone the digest in the log can't be brute-forced back to the value.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import orjson
import redis

from saga_store.keys import SagaKeys
from saga_store.log.canonical import canonical
from saga_store.log.stream import SagaLog, SideWrite


class Secrets:
    def __init__(self, client: redis.Redis, ttl_s: int, log: SagaLog) -> None:
        self.redis, self.ttl_s, self.log = client, ttl_s, log

    def salt(self, saga_id: str) -> bytes:
        k = self.log.keys.secrets(saga_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(k, "_salt", os.urandom(16))
        pipe.hget(k, "_salt")
        pipe.expire(k, self.ttl_s)
        salt: bytes = pipe.execute()[1]
        return salt

    @staticmethod
    def redact(args: Mapping[str, Any], secret: frozenset[str], salt: bytes,
               ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(args as logged, the secret values)."""
        logged, values = dict(args), {}
        for name in secret & args.keys():
            values[name] = args[name]
            digest = hashlib.sha256(salt + canonical(args[name])).hexdigest()
            logged[name] = {"$secret": digest}
        return logged, values

    def writes(self, saga_id: str, values: Mapping[int, Mapping[str, Any]],
               salt: bytes | None = None) -> list[SideWrite]:
        """The secret values of steps (and a new saga's salt) as writes the append
        script makes with the step's intent: an append that is refused (a saga id
        already taken, a lost race) leaves no secret behind."""
        if not values and salt is None:
            return []
        pairs: list[Any] = [] if salt is None else ["_salt", salt]
        for step, vals in values.items():
            pairs += (str(step), canonical(dict(vals)))
        key = self.log.keys.secrets(saga_id)
        return [SideWrite("hset", key, tuple(pairs)),
                SideWrite("pexpire", key, (self.ttl_s * 1000,))]

    @staticmethod
    def retire(names: SagaKeys, saga_id: str) -> SideWrite:
        """The write, with a saga's close, that drops its secret values and salt:
        once it is closed no step of it runs again, and without the salt the
        digests in the log cannot be brute-forced back to the values."""
        return SideWrite("pexpire", names.secrets(saga_id), (0,))

    def restore(self, saga_id: str, step: int, logged: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments with their secret values put back (for calling the tool)."""
        if not any(isinstance(v, dict) and "$secret" in v for v in logged.values()):
            return dict(logged)
        raw = self.redis.hget(self.log.keys.secrets(saga_id), str(step))
        values = orjson.loads(raw) if raw else {}
        out = dict(logged)
        for name, value in values.items():
            out[name] = value
        return out


def scrub(text: str, secrets: Mapping[str, Any] | None) -> str:
    """``text`` with any secret argument value blanked out (exceptions and servers
    quote arguments). Values under 4 characters are left: they would blank noise."""
    for value in (secrets or {}).values():
        s = str(value)
        if len(s) >= 4:
            text = text.replace(s, "***")
    return text
