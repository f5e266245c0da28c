"""An explicit idempotency key names one call: the same key with another tool or
other arguments is refused (KeyReuseError, nothing runs), in the same saga as
across sagas; the same call again gets the recorded answer."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from saga_store import KeyReuseError, keys
from saga_store.client.api import SagaStore
from saga_store.errors import InvalidInput, SagaAborted, StepPending
from saga_store.execution.idempotency import explicit_key
from saga_store.testing.workers import workers

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]
TOOLS = "tests.ledger_tools"
ROOT = Path(__file__).resolve().parents[2]


def test_a_key_reused_in_the_same_saga_for_another_call_is_refused(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    with workers(worker_env, TOOLS), saga_store.saga(agent_id="agent-k") as saga:
        first = saga.call("reserve_inventory", {"sku": "K3", "qty": 1},
                          idempotency_key="order-3-book")
        again = saga.call("reserve_inventory", {"sku": "K3", "qty": 1},
                          idempotency_key="order-3-book")
        assert again == first  # the same call: its recorded answer
        with pytest.raises(KeyReuseError, match="other arguments"):
            saga.call("reserve_inventory", {"sku": "K4", "qty": 1},
                      idempotency_key="order-3-book")
        with pytest.raises(KeyReuseError):
            saga.call("noop", {"n": 1}, idempotency_key="order-3-book")
    assert [e[2] for e in effects("reserve")] == ["K3x1"]
    st = saga_store.state(saga.saga_id)
    assert len(st.steps) == 1  # the refused calls left no event


def test_a_keyed_call_refused_before_its_intent_frees_its_key(
        saga_store: SagaStore, client: redis.Redis, worker_env: dict[str, str],
        ledger: Path) -> None:
    """The saga was aborted under the caller, or the arguments are too large to log:
    the call never became a step, so its key's claim is settled at once and a
    retry (in a new saga) runs the call, once."""
    with workers(worker_env, TOOLS):
        saga = saga_store.saga(agent_id="agent-k")
        assert saga_store.abort(saga.saga_id)
        with pytest.raises(SagaAborted):
            saga.call("reserve_inventory", {"sku": "K5", "qty": 1}, idempotency_key="k-5")
        with pytest.raises(InvalidInput, match="exceeds"), \
                saga_store.saga(agent_id="agent-k") as other:
            other.call("update_crm", {"note": "x" * 300_000}, idempotency_key="k-6")
        assert not client.exists(keys.agent_idem("agent-k", explicit_key("k-5")))
        assert not client.exists(keys.agent_idem("agent-k", explicit_key("k-6")))
        with saga_store.saga(agent_id="agent-k") as retry:
            got = retry.call("reserve_inventory", {"sku": "K5", "qty": 1},
                             idempotency_key="k-5")
    assert got["reservation_id"]
    assert [e[2] for e in effects("reserve")] == ["K5x1"]


CLAIM_THEN_DIE = """
import sys
from saga_store import Registry, SagaStore, Settings
store = SagaStore.from_url(sys.argv[1], Registry.from_modules("tests.ledger_tools"),
                           Settings(lease_ms=1000))
saga = store.saga(agent_id="agent-k")
print(saga.saga_id, flush=True)
saga.call("reserve_inventory", {"sku": "K7", "qty": 1}, idempotency_key="k-7")
"""


def test_a_client_killed_between_claim_and_intent_does_not_brick_the_key(
        saga_store: SagaStore, client: redis.Redis, redis_url: str,
        worker_env: dict[str, str], ledger: Path, tmp_path: Path) -> None:
    """kill -9 of the client after it claimed the key, before its intent: while its
    saga could still log the call a retry is told to wait (never runs it twice);
    once that saga is unwinding it never can, and a retry takes the key over."""
    flag = tmp_path / "flag"
    flag.touch()
    proc = subprocess.run([sys.executable, "-c", CLAIM_THEN_DIE, redis_url],
                          env={**worker_env, "SAGA_FAULT": "after_claim",
                               "SAGA_FAULT_ONCE": str(flag)},
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    dead = proc.stdout.split()[0]
    assert client.hget(keys.agent_idem("agent-k", explicit_key("k-7")), "state") == b"pending"
    with workers(worker_env, TOOLS):
        with saga_store.saga(agent_id="agent-k") as retry, \
                pytest.raises(StepPending, match="in progress"):
            retry.call("reserve_inventory", {"sku": "K7", "qty": 1}, idempotency_key="k-7")
        assert effects("reserve") == []
        assert saga_store.abort(dead)  # what the sweeper does once its client's lease lapses
        with saga_store.saga(agent_id="agent-k") as retry:
            got = retry.call("reserve_inventory", {"sku": "K7", "qty": 1},
                             idempotency_key="k-7")
    assert got["reservation_id"]
    assert [e[2] for e in effects("reserve")] == ["K7x1"]


def test_a_keys_record_cannot_be_brute_forced_back_to_a_secret(
        client: redis.Redis, worker_env: dict[str, str], ledger: Path) -> None:
    """The record of an explicit key holds no unsalted hash of a secret argument:
    trying every 4-digit PIN against it finds nothing, with the HMAC key set."""
    import hashlib

    from saga_store import Registry, Settings
    from saga_store.log.canonical import canonical
    key = b"k" * 32
    store = SagaStore(client, Registry.from_modules(TOOLS), Settings(hmac_key=key))
    env = {**worker_env, "SAGA_HMAC_KEY": key.decode()}
    with workers(env, TOOLS), store.saga(agent_id="agent-k") as saga:
        saga.call("charge_payment", {"amount_cents": 5, "card_number": "4000"},
                  idempotency_key="pin-1")
    kept = client.hget(keys.agent_idem("agent-k", explicit_key("pin-1")), "args").decode()
    guesses = {hashlib.sha256(canonical(["saga-store/idem/v1", "args", "charge_payment",
                                         {"amount_cents": 5, "card_number": f"{n:04d}"}])
                              ).hexdigest() for n in range(10_000)}
    assert kept not in guesses
    assert len(effects("charge")) == 1


@pytest.mark.parametrize("agent", ["agent-k", "agent_k.eu"])
def test_a_key_dedupes_across_every_saga_of_its_agent_whatever_the_saga_ids(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path, agent: str) -> None:
    """The scope of an explicit key is the saga's agent, not the form of its id: the
    same key in a saga whose id the caller chose and in one with an auto id is the
    same call (its body runs once, the second gets its answer), and with other
    arguments it is refused. An agent that owns no namespace (an id with '_' and
    '.') is scoped the same way."""
    tag = agent.replace("_", "-").replace(".", "-").upper()
    card = {"amount_cents": 500}
    with workers(worker_env, TOOLS):
        with saga_store.saga(agent_id=agent, saga_id=f"ORDER-1-{tag}") as named:
            first = named.call("bill", card, idempotency_key="order-1-charge")
        with saga_store.saga(agent_id=agent) as auto:
            again = auto.call("bill", card, idempotency_key="order-1-charge")
            with pytest.raises(KeyReuseError, match="arguments"):
                auto.call("bill", {**card, "amount_cents": 900},
                          idempotency_key="order-1-charge")
        with saga_store.saga(agent_id=agent, saga_id=f"ORDER-2-{tag}") as other, \
                pytest.raises(KeyReuseError, match="arguments"):
            other.call("bill", {**card, "amount_cents": 900},
                       idempotency_key="order-1-charge")
    assert again == first
    assert len(effects("bill")) == 1


def test_two_agents_keys_are_their_own(
        saga_store: SagaStore, worker_env: dict[str, str], ledger: Path) -> None:
    """Another agent's key of the same name is another call: it runs, and neither
    agent is given the other's answer."""
    card = {"amount_cents": 500}
    with workers(worker_env, TOOLS):
        for agent in ("agent-x", "agent-y", "agent_z"):
            with saga_store.saga(agent_id=agent, saga_id=f"ORDER-7-{agent[-1]}") as saga:
                saga.call("bill", card, idempotency_key="order-7-charge")
    assert len(effects("bill")) == 3
