"""Moving a store from one Redis to a Redis Cluster, as the README's operations
section says: 'saga migrate' on the one Redis (the ledger into buckets, nothing
rewritten), then Redis's own 'redis-cli --cluster import', then every process
pointed at the cluster. Its chains verify there, its anchor holds, and its
sagas go on."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import redis
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import keys
from saga_store.log.events import EventKind as K
from saga_store.log.layout import V1, Layout
from saga_store.log.store import EventStore
from saga_store.ops.connection import connect
from saga_store.testing import RedisServer
from saga_store.testing.cluster import RedisClusterServers
from saga_store.verify.checker import Verifier

from ..helpers import committed_saga

# a store of layout 1 migrated, then moved: the cluster starts empty
pytestmark = [pytest.mark.cluster, pytest.mark.real_redis, pytest.mark.layout(1)]


def test_a_store_of_the_old_layout_moves_onto_a_cluster_and_goes_on(
        servers: RedisClusterServers, client: redis.Redis) -> None:
    env = {"SAGA_HMAC_KEY": "", "SAGA_HMAC_KEY_FILE": ""}
    with RedisServer(appendfsync="everysec") as one:
        old = EventStore(redis.Redis.from_url(one.url))
        old.log._layout = V1  # written as releases before ledger buckets wrote it
        done = [committed_saga(old).saga_id for _ in range(5)]
        still_open = old.open("agent-1")
        res = CliRunner().invoke(cli, ["migrate"], env={**env, "SAGA_REDIS_URL": one.url})
        assert res.exit_code == 0, res.output
        anchor = EventStore(redis.Redis.from_url(one.url)).ledger.anchor()
        tool = shutil.which("redis-cli")
        assert tool is not None
        node = servers.masters()[0]
        subprocess.run([tool, "--cluster", "import", f"127.0.0.1:{node.port}",
                        "--cluster-from", f"127.0.0.1:{one.port}", "--cluster-copy"],
                       check=True, capture_output=True, timeout=120)
    moved = EventStore(connect(servers.url))
    assert moved.log.layout == Layout(2, 1024)
    assert moved.exists(done[0])
    assert Verifier(moved.log).verify().ok
    assert moved.ledger.check_anchor(anchor) == []
    res = CliRunner().invoke(cli, ["verify"], env={**env, "SAGA_REDIS_URL": servers.url,
                                                   "SAGA_QUEUE_URL": servers.queue_url})
    assert res.exit_code == 0, res.output
    # the saga left open closes on the cluster, into its bucket's chain
    moved.writer(still_open.saga_id).append(K.SAGA_COMMITTED)
    chain = moved.log.layout.ledger_of(still_open.saga_id)
    assert any(e["data"]["saga_id"] == still_open.saga_id and e["kind"] == K.LEDGER_CLOSED
               for e in moved.log.bodies(chain))
    assert client.exists(keys.LEDGER_LOG)  # the old chain came along, and still counts
    assert Verifier(moved.log).verify().ok
    assert moved.ledger.check_anchor(moved.ledger.anchor()) == []
