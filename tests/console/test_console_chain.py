"""Each saga's page checks that saga's hash chain as it loads: an intact chain
says so with the number of events checked; a chain whose entry was edited in
Redis names the first bad event's seq and the reason."""

from __future__ import annotations

import re

import pytest
import redis

from saga_store import SagaStore

from ..console_helpers import console
from ..helpers import committed_saga, edit_body, tamper

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(60)]


def test_an_intact_chain_and_a_tampered_one_on_their_pages(
        saga_store: SagaStore, client: redis.Redis) -> None:
    intact = committed_saga(saga_store.events, steps=2, agent="agent-a").saga_id
    forged = committed_saga(saga_store.events, steps=2, agent="agent-b").saga_id

    def inflate(body: dict[str, object]) -> None:
        body["data"] = {"args": {"n": 0, "pad": "x" * 40, "amount": 10_000},
                        "reversibility": "compensable"}

    # an attacker with write access rewrites step 0's intent (seq 1), hashes left alone
    tamper(client, forged, lambda es: [es[0], edit_body(es[1], inflate), *es[2:]])
    tc = console(saga_store)
    page = tc.get(f"/sagas/{intact}").text
    assert re.search(r'id="chain">hash chain intact: 8 events checked', page), page
    page = tc.get(f"/sagas/{forged}").text
    assert 'id="chain">hash chain intact' not in page
    assert '<b id="chain-seq">1</b>' in page
    reason = re.search(r'<span id="chain-reason">([^<]+)</span>', page)
    assert reason is not None
    assert reason.group(1) == "hash_mismatch"
