"""Fixtures every adapter test shares: a store on the suite's Redis with the
integration tools, and workers running them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from saga_store import SagaStore
from saga_store.testing.workers import workers

from ..integration_support import TOOLS, saga_store_for


@pytest.fixture
def store(client: redis.Redis) -> SagaStore:
    return saga_store_for(client)


@pytest.fixture
def running(worker_env: dict[str, str], ledger: Path) -> Iterator[None]:
    with workers(worker_env, TOOLS):
        yield
