"""SagaSession, the sagas of one framework run: after a rollback a new call is
refused with one sentence saying what to do, or, with ``on_rollback="new_saga"``,
opens the next saga; a saga id chosen from the first call's id, the same in every
process; the session commits on exit unless the run waits for a person."""

from __future__ import annotations

import pytest

from saga_store import InvalidInput, SagaStore, Status
from saga_store.integrations._session import SagaSession, saga_id_for

from ..integration_support import CRM_FAILS, RESERVE, final, kinds

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


def test_after_a_rollback_a_new_call_is_refused_in_one_sentence(
        store: SagaStore, running: None) -> None:
    with SagaSession(store, "shop") as session:
        assert session.calls("c1").run(*RESERVE, "c1").ok
        assert not session.calls("c2").run(*CRM_FAILS, "c2").ok
        refused = session.calls("c3").run(*RESERVE, "c3")
        sid = session.saga_id
    assert sid == saga_id_for("shop", None, "c1")
    assert session.sagas == [sid]
    assert not refused.ok
    assert refused.text.startswith(
        f"reserve_inventory was not run: saga {sid} was rolled back and takes no more "
        "calls; tell the user what was undone and let them decide whether to start over.")
    assert final(store, sid).status is Status.COMPENSATED
    assert kinds() == ["reserve", "release"]


def test_on_rollback_new_saga_opens_the_next_saga_at_the_next_call(
        store: SagaStore, running: None) -> None:
    with SagaSession(store, "shop", on_rollback="new_saga") as session:
        session.calls("c1").run(*RESERVE, "c1")
        session.calls("c2").run(*CRM_FAILS, "c2")
        again = session.calls("c3").run(*RESERVE, "c3")
        # the rolled-back saga's own calls are still answered from its log
        replay = session.calls("c1", ["c1", "c2", "c3"]).run(*RESERVE, "c1")
    first, second = session.sagas[0], session.sagas[-1]
    assert again.ok
    assert second == saga_id_for("shop", None, "c3") != first
    assert replay.text.startswith("rolled back:")
    assert final(store, first).status is Status.COMPENSATED
    assert final(store, second).status is Status.COMMITTED  # committed on exit
    assert kinds() == ["reserve", "release", "reserve"]


def test_on_rollback_takes_only_its_two_choices(store: SagaStore) -> None:
    with pytest.raises(InvalidInput, match="on_rollback must be one of"):
        SagaSession(store, "shop", on_rollback="retry")
