"""Masking for display: nothing that looks like a secret reaches a page.

The log already holds declared secrets only as salted digests
(``{"$secret": ...}``); a page also masks any value whose key is named like a
secret, in case a tool never declared it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import orjson

MASK = "***"
# words that make a field secret, matched against the parts of its name
# (card_number, apiKey, X-Auth-Token), so "shipping" or "session_id" stay visible
SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "pass", "pwd", "secret", "secrets", "token",
    "apikey", "privatekey", "accesskey", "credential", "credentials", "auth",
    "authorization", "cookie", "cvv", "cvc", "pin", "ssn", "iban", "cardnumber", "cardno",
    "pan", "otp", "signature"})
_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def secret_named(key: str) -> bool:
    """Whether a field called ``key`` should be treated as a secret."""
    parts = [p.lower() for p in _PARTS.split(key) if p]
    pairs = [a + b for a, b in itertools.pairwise(parts)]
    return any(p in SECRET_WORDS for p in [*parts, *pairs])


def mask(value: Any) -> Any:
    """``value`` with declared secrets and secret-named fields replaced by ***."""
    if isinstance(value, dict):
        if "$secret" in value:
            return MASK
        return {k: MASK if isinstance(k, str) and secret_named(k) else mask(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def mask_messages(messages: Any) -> Any:
    """A rebuilt history, masked: also inside JSON carried as text (OpenAI's
    ``arguments``, a tool result's ``content``)."""
    if isinstance(messages, list):
        return [mask_messages(m) for m in messages]
    if not isinstance(messages, dict):
        return messages
    out = {}
    for k, v in messages.items():
        if k in ("arguments", "content") and isinstance(v, str) and v[:1] in "{[":
            try:
                out[k] = orjson.dumps(mask(orjson.loads(v))).decode()
            except orjson.JSONDecodeError:
                out[k] = v
        elif k in ("input", "args", "result") and isinstance(v, dict | list):
            out[k] = mask(v)
        else:
            out[k] = mask_messages(v)
    return out


def short_json(value: Any, limit: int = 160) -> str:
    """Masked, compact JSON, cut to ``limit`` characters."""
    if value is None:
        return ""
    text = orjson.dumps(mask(value), option=orjson.OPT_NON_STR_KEYS).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"
