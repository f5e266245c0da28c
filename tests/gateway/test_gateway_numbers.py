"""The gateway refuses a tools/call whose arguments hold NaN, Infinity, an
integer beyond 2^53 or nesting past the limit: the client gets a tool error
(or, for a line no JSON reader should take, a parse error) saying what is
wrong, the server is never called, and no saga is written. orjson alone would
read 2^64 as a float and the call would go on with a number nobody sent."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import pytest
import redis

from saga_store import Registry, SagaStore, Settings
from saga_store.approval.policy import Policy
from saga_store.mcp.classify import Classification
from saga_store.mcp.gateway import CallOutcome, Gateway

from ..number_tools import deep
from .test_mcp_gateway import RawGateway, _effects, _sagas
from .test_mcp_gateway import gw as gw  # the fixture: a gateway's command and ledger

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(120)]


class Downstream:
    """A server that records what it is asked and always succeeds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, args: dict[str, Any],
                       meta: dict[str, Any]) -> CallOutcome:
        self.calls.append((name, args))
        return CallOutcome(True, {"ok": True}, "ok")


@pytest.mark.parametrize(("args", "message"), [
    ({"note": math.nan}, "arguments.note: nan is not allowed in JSON"),
    ({"note": {"x": [math.inf]}}, "arguments.note.x[0]: inf is not allowed in JSON"),
    ({"amount_cents": 2**64}, "arguments.amount_cents: integer 18446744073709551616 is beyond"),
    ({"amount_cents": -(2**53) - 1}, "integer -9007199254740993 is beyond 2^53"),
    ({"note": deep(33)}, "nested deeper than 32 levels"),
    ({"note": deep(10_000)}, "nested deeper than 32 levels"),
], ids=["nan", "inf", "2^64", "-2^53-1", "depth-33", "depth-10000"])
def test_a_call_with_a_bad_number_or_depth_is_refused_before_anything_is_written(
        client: redis.Redis, args: dict[str, Any], message: str) -> None:
    store = SagaStore(client, Registry(), Settings(lease_ms=2000))
    down = Downstream()
    gateway = Gateway(store, Policy.permissive(),
                      {"update_crm": Classification("irreversible", None, "tools-map")},
                      down, "gw-numbers")
    before = client.dbsize()
    out = anyio.run(gateway.handle, "update_crm", args, None)
    assert not out.ok
    assert out.text.startswith("invalid arguments for update_crm: ")
    assert message in out.text
    assert down.calls == []
    assert client.dbsize() == before


def test_the_wire_refuses_what_json_readers_disagree_on(gw: dict[str, Any]) -> None:
    """Over stdio: 2^64 and deep nesting get a tool error, with the request's own id
    (2^64 too, sent back as it came); NaN and a line nested 10,000 deep a parse
    error. The server runs nothing and no saga is written; the session goes on."""
    raw = RawGateway(gw)
    raw.call(1, "charge", {"amount_cents": 2**64})
    refused = raw.receive()
    assert refused["id"] == 1
    assert refused["result"]["isError"]
    assert "arguments.amount_cents: integer 18446744073709551616 is beyond 2^53" in \
        refused["result"]["content"][0]["text"]
    raw.call(2**64, "create_record", {"name": deep(40)})
    refused = raw.receive()
    assert refused["id"] == 2**64
    assert refused["result"]["isError"]
    assert "nested deeper than 32 levels" in refused["result"]["content"][0]["text"]
    assert raw.proc.stdin is not None
    for line, message in [
        (json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                     "params": {"name": "charge", "arguments": {"amount_cents": math.nan}}}),
         "NaN is not allowed in JSON"),
        ('{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": '
         '"create_record", "arguments": {"name": ' + "[" * 10_000 + "]" * 10_000 + "}}}",
         "nested too deeply"),
    ]:
        raw.proc.stdin.write(line + "\n")
        raw.proc.stdin.flush()
        error = raw.receive()
        assert (error["id"], error["error"]["code"]) == (None, -32700), error
        assert message in error["error"]["message"]
    assert _effects(gw["ledger"]) == []
    assert _sagas(gw["store"]) == []
    raw.call(5, "create_record", {"name": "kept"})
    assert not raw.receive()["result"]["isError"]
    raw.stop()
    assert [k for _, k, _ in _effects(gw["ledger"])] == ["create"]
