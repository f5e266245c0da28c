"""The hash chain: how one event's hash is computed from the one before.

    hash = SHA-256(TAG || prev || body)          without a key
    hash = HMAC-SHA256(key, TAG || prev || body) with a key

``body`` is the canonical encoding of the event without its ``prev`` and
``hash`` fields (prev is already fed in front of it, so it is covered once).
``prev`` of event 0 is the genesis value derived from the chain id, so an
event cannot be spliced from one saga into another. The HMAC key lives outside
Redis (environment or file): someone who can only write Redis then cannot
produce a chain that verifies.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Final

from saga_store.errors import InvalidInput

TAG: Final = b"saga-store/event/v1\x00"
GENESIS_TAG: Final = b"saga-store/genesis/v1\x00"
ANCHOR_TAG: Final = b"saga-store/anchor/v1\x00"


class Chain:
    """Computes and checks hashes; one instance per process, built from settings."""

    __slots__ = ("key", "mode")

    def __init__(self, key: bytes | None = None) -> None:
        if key is not None and len(key) < 16:
            raise InvalidInput("HMAC key is too short: use at least 16 bytes (32 recommended)")
        self.key = key
        self.mode = "hmac-sha256" if key else "sha256"

    def genesis(self, chain_id: str) -> bytes:
        return hashlib.sha256(GENESIS_TAG + chain_id.encode()).digest()

    def link(self, prev: bytes, body: bytes) -> bytes:
        if self.key is None:
            return hashlib.sha256(TAG + prev + body).digest()
        return hmac.digest(self.key, TAG + prev + body, "sha256")

    def sign(self, message: bytes) -> str | None:
        """HMAC signature for anchors; None when no key is configured."""
        if self.key is None:
            return None
        return hmac.digest(self.key, ANCHOR_TAG + message, "sha256").hex()

    def check_signature(self, message: bytes, sig: str) -> bool:
        mine = self.sign(message)
        return mine is not None and hmac.compare_digest(mine, sig)


def load_key(env_value: str | None, file_path: str | None) -> bytes | None:
    """The HMAC key from ``SAGA_HMAC_KEY`` (hex or text) or ``SAGA_HMAC_KEY_FILE``."""
    if file_path:
        try:
            raw = Path(file_path).read_bytes().strip()
        except OSError as exc:
            raise InvalidInput(f"cannot read HMAC key file {file_path}: {exc.strerror}") from exc
        return raw or None
    if env_value:
        try:
            return bytes.fromhex(env_value)
        except ValueError:
            return env_value.encode()
    return None
