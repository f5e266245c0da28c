"""Least-privilege agents, with the ACL lines applied exactly as the README shows
them (``saga acl ... | redis-cli``): an agent's own flows work, and every write
it could make outside its namespace is refused, or is caught by ``saga verify``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from saga_store import Registry, SagaStore, Settings, keys
from saga_store.client.context import Subscriber
from saga_store.errors import InvalidInput, StepError
from saga_store.execution import jobs
from saga_store.execution.idempotency import explicit_key
from saga_store.log.layout import names_of
from saga_store.ops.connection import connect
from saga_store.protocol.state import Status
from saga_store.testing import RedisServer, assert_eventually
from saga_store.testing.workers import workers
from saga_store.verify.checker import Verifier

from ..ledger_tools import effects

pytestmark = [pytest.mark.real_redis, pytest.mark.timeout(180)]
TOOLS = "tests.ledger_tools"
ROOT = str(Path(__file__).resolve().parents[2])
CARD = "4111222233334444"
PLAN = [{"tool": "reserve_inventory", "args": {"sku": "A", "qty": 1}},
        {"tool": "charge_payment", "args": {"amount_cents": 1200, "card_number": CARD}}]
# commands an attacker would write with: every write command of every key type
WRITES = [("SET", "x"), ("DEL",), ("UNLINK",), ("PEXPIRE", "0"), ("EXPIRE", "1"),
          ("PERSIST",), ("RENAME", "ss:stolen"), ("HSET", "state", "committed"),
          ("HSETNX", "zz", "1"), ("HDEL", "state"), ("HINCRBY", "seq", "1"),
          ("XADD", "*", "b", "junk"), ("XDEL", "0-1"), ("XTRIM", "MAXLEN", "0"),
          ("XSETID", "0-1"), ("ZADD", "0", "someone"), ("ZREM", "someone"),
          ("ZREMRANGEBYRANK", "0", "-1"), ("SADD", "junk"), ("SREM", "agent-b"),
          ("SPOP",), ("RPUSH", "junk"), ("LPUSH", "junk"), ("LTRIM", "1", "-1"),
          ("LPOP",), ("RPOP",), ("LSET", "0", "junk"), ("LREM", "0", "x")]


def cli(url: str, *args: str, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    if namespace is not None:
        env["SAGA_NAMESPACE"] = namespace
    return subprocess.run([sys.executable, "-m", "saga_store.cli.main", "--redis-url", url,
                           *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          check=False, env=env)


def apply_as_readme(port: int, role_args: list[str], user: str, password: str,
                    namespace: str | None = None) -> None:
    """``saga acl ROLE ... | redis-cli`` then the password, as the README says."""
    line = cli("redis://127.0.0.1:1/0", "acl", *role_args, namespace=namespace)
    assert line.returncode == 0, line.stderr
    for cmd in (line.stdout, f"ACL SETUSER {user} >{password}\n"):
        out = subprocess.run(["redis-cli", "-p", str(port)], input=cmd, capture_output=True,
                             text=True, timeout=30, check=True)
        assert out.stdout.strip() == "OK", out.stdout + out.stderr


def owned_by(agent: str, key: bytes) -> bool:
    """Whether ``key`` is of ``agent``'s namespace: its sagas' keys and its own, under
    its hash tag (``ss:{A_...}:...``, layout 2; its explicit keys' records in layout 3
    too) or under a bucket's (``ss:{b<n>}:A_...:...``, layout 3), its context stream,
    its steps' jobs (the patterns of its ACL user: see saga_store/ops/acl.py)."""
    mine = (f"ss:{{{agent}_".encode(), f"ss:ctx:{{{agent}}}".encode(),
            f"rq:job:saga-step-{agent}_".encode(), f"rq:job:saga-comp-{agent}_".encode())
    return key.startswith(mine) or re.match(rb"ss:\{b\d+\}:%s_" % re.escape(agent.encode()),
                                            key) is not None


def refused(client: redis.Redis, *command: Any) -> bool:
    try:
        client.execute_command(*command)
    except redis.ResponseError as exc:
        return "NOPERM" in str(exc) or "no permissions" in str(exc)
    return False


@pytest.fixture
def deployment(ledger: Path, store_layout: str | None) -> Any:
    with RedisServer() as srv:
        if store_layout:  # the store of the run's layout (SAGA_TEST_LAYOUT), as ``client``
            redis.Redis(port=srv.port).set(keys.LAYOUT, store_layout)
        apply_as_readme(srv.port, ["worker"], "saga-worker", "w-pass")
        for agent in ("agent-a", "agent-a-b"):
            apply_as_readme(srv.port, ["agent", "--agent", agent], agent, f"{agent}-pass")
        base = f"127.0.0.1:{srv.port}/0"
        env = {**os.environ, "SAGA_REDIS_URL": f"redis://saga-worker:w-pass@{base}",
               "SAGA_TEST_LEDGER": str(ledger), "SAGA_LEASE_MS": "2000", "PYTHONPATH": ROOT}
        registry = Registry.from_modules(TOOLS)

        def agent(name: str) -> SagaStore:
            return SagaStore(connect(f"redis://{name}:{name}-pass@{base}", retry_s=0),
                             registry, Settings(lease_ms=2000))
        yield {"admin": redis.Redis.from_url(srv.url), "env": env, "agent": agent,
               "url": srv.url}


def test_an_agent_user_runs_every_flow_of_its_own(deployment: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """Plans, a client-driven saga with an explicit key and a secret, an abort that
    unwinds, and its context stream: all work for the agent user; the workers are
    refused nothing; verify passes."""
    a = deployment["agent"]("agent-a")
    sub = Subscriber(a.redis, "agent-a", last_id="0", block_ms=100)
    log = tmp_path / "worker.log"
    with workers(deployment["env"], TOOLS, "--log-level", "INFO", log=log):
        planned = a.submit(PLAN, agent_id="agent-a")
        assert planned.startswith("agent-a_")
        assert a.wait(planned, timeout=60).status is Status.COMMITTED
        with a.saga(agent_id="agent-a") as saga:
            first = saga.call("charge_payment", {"amount_cents": 5, "card_number": CARD},
                              idempotency_key="order-1")
            again = saga.call("charge_payment", {"amount_cents": 5, "card_number": CARD},
                              idempotency_key="order-1")
            assert again == first
        undone = a.saga(agent_id="agent-a")
        undone.call("reserve_inventory", {"sku": "U", "qty": 1})
        undone.abort("the agent changed its mind")
        assert a.wait(undone.saga_id, timeout=60).status is Status.COMPENSATED
        heard = [e["kind"] for e in sub.poll()]
    log_text = log.read_text()
    assert a.state(saga.saga_id).status is Status.COMMITTED
    assert len(effects("charge")) == 2
    assert len(effects("release")) == 1
    assert "retracted" in heard
    assert "saga_closed" in heard
    assert "NOPERM" not in log_text, "a worker was refused something it needs"
    assert "Traceback" not in log_text
    admin = SagaStore(deployment["admin"], Registry.from_modules(TOOLS))
    assert admin.events.ledger.flush() == 0  # the workers chained what the agent pushed
    assert Verifier(admin.events.log).verify().ok


def test_every_write_outside_its_namespace_is_refused_or_caught(
        deployment: dict[str, Any]) -> None:
    """Agent a tries every write command on every key it does not own: agent a-b's
    saga (whose id agent a's old prefix pattern covered), the ledger, the shared
    and a-b's indexes, the queues' jobs, explicit keys' records. Each is refused
    and nothing outside its namespace changed, except the three additive keys it
    may push to; a forged entry pushed there is caught by verify."""
    admin = deployment["admin"]
    a, ab = deployment["agent"]("agent-a"), deployment["agent"]("agent-a-b")
    with workers(deployment["env"], TOOLS):
        victim = ab.submit(PLAN, agent_id="agent-a-b")
        ab.wait(victim, timeout=60)
        with ab.saga(agent_id="agent-a-b") as keyed:
            keyed.call("noop", {"n": 1}, idempotency_key="ab-1")
        mine = a.submit(PLAN[:1], agent_id="agent-a")
        a.wait(mine, timeout=60)
        # an agent may not seal: the workers' sweepers do, a slice of buckets a pass
        assert_eventually(lambda: not ab.events.ledger.backlog(), timeout=30,
                          what="the workers to seal the ledger")
    # a saga of agent-a-b's still in flight, with a queued job: the targets at their richest
    pending = ab.submit(PLAN[:1], agent_id="agent-a-b")
    names = names_of(admin)
    shared = names.active("legacy-saga")  # an index of no agent's, which older versions
    admin.zadd(shared, {"legacy-saga": 1})  # wrote every saga to
    # the stopped workers' sweep leases lapse on their own: gone before the snapshot
    assert_eventually(lambda: not list(admin.scan_iter(match=f"{keys.PREFIX}:sweep:*")),
                      timeout=10, what="the stopped workers' sweep leases to lapse")
    theirs = [k for k in admin.scan_iter(count=1000) if not owned_by("agent-a", k)]
    listed = names.agents_list(pending)  # where its agent is listed for the sweepers
    assert {names.log(victim).encode(), names.active(pending).encode(),
            keys.agent_idem("agent-a-b", explicit_key("ab-1")).encode(),
            keys.ledger_log(ab.events.log.layout.ledger_of(victim)).encode(),
            shared.encode(), listed.encode(),
            jobs.job_key(jobs.step_job_id(ab.state(pending).steps[0].idem_key or "", 1,
                                          pending)).encode()} <= set(theirs)
    before = {k: admin.dump(k) for k in theirs}
    every_pending = {keys.ledger_pending(c).encode() for c in ab.events.ledger.chains()}
    lists = {names.bucket_agents(b).encode() for b in names.all_buckets()} \
        if names.bucketed else set()  # a bucket's agents with an index in it
    additive = {*every_pending, *lists, keys.AGENTS.encode(),
                jobs.queue_key(jobs.STEP_QUEUE).encode(),
                jobs.queue_key(jobs.COMPENSATION_QUEUE).encode()}
    allowed = []
    for key in theirs:
        for cmd, *args in WRITES:
            if not refused(a.redis, cmd, key, *args):
                allowed.append((key, cmd))
    # reads, too: nothing of agent-a-b's is readable
    for cmd in (("XRANGE", names.log(victim), "-", "+"),
                ("HGETALL", names.secrets(pending)), ("HGETALL", names.meta(victim))):
        assert refused(a.redis, *cmd), cmd
    # scripts run with the caller's rights: no way around it through them
    assert refused(a.redis, "EVAL", "return redis.call('HSET', KEYS[1], 'state', 'x')", 1,
                   names.meta(victim))
    assert {(k, c) for k, c in allowed} <= {(k, c) for k in additive
                                           for c in ("RPUSH", "SADD")}, allowed
    changed = {k for k in theirs if admin.dump(k) != before[k]}
    assert changed <= additive, changed
    # what the additive pushes can do: a junk job id is refused by the workers, a
    # name in ss:agents is an empty index, and a forged ledger entry is set aside
    # by the sealer and fails verify
    admin_store = SagaStore(admin, Registry.from_modules(TOOLS))
    victims = keys.ledger_pending(ab.events.log.layout.ledger_of(victim))
    a.redis.rpush(victims, b'{"kind":"saga_closed","data":{"saga_id":"%s",'
                  b'"state":"committed","seq":1,"hash":"00"}}' % victim.encode())
    admin_store.events.ledger.flush()
    bad = cli(deployment["url"], "verify")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "rejected_entry" in bad.stdout


def test_every_single_write_to_its_own_log_is_refused_or_caught(
        deployment: dict[str, Any]) -> None:
    """Inside its namespace an agent can spoil only its own sagas, and not unseen:
    each write command on its own saga's log is refused, or (XADD) makes verify
    fail; so does rewriting its cached state or phase. Each try starts from the
    intact saga (restored by the admin)."""
    admin = deployment["admin"]
    a = deployment["agent"]("agent-a")
    with workers(deployment["env"], TOOLS):
        sid = a.submit(PLAN[:1], agent_id="agent-a")
        a.wait(sid, timeout=60)
    SagaStore(admin, Registry.from_modules(TOOLS)).events.ledger.flush()
    assert cli(deployment["url"], "verify").returncode == 0
    names = names_of(admin)
    log_key, meta_key = names.log(sid), names.meta(sid)
    intact = {k: admin.dump(k) for k in (log_key, meta_key)}
    tries = [(log_key, cmd, *args) for cmd, *args in WRITES] + [
        (meta_key, "HSET", "state", "committed"), (meta_key, "HSET", "state", "running"),
        (meta_key, "HSET", "phase", "forward")]
    unseen = []
    for key, cmd, *args in tries:
        if key == meta_key and cmd == "HSET" and admin.hget(meta_key, args[0]) == \
                args[1].encode():
            args = [args[0], "compensating"]  # a change, not the value it has
        if refused(a.redis, cmd, key, *args):
            continue
        if cli(deployment["url"], "verify", "--saga", sid).returncode != 1:
            unseen.append((key, cmd))
        for k, raw in intact.items():
            admin.restore(k, 0, raw, replace=True)
    assert not unseen, unseen


def test_an_agent_user_runs_inline_with_no_worker(deployment: dict[str, Any]) -> None:
    """The inline executor needs no more rights than the agent's own user: a saga
    commits, a failing one is unwound, with no worker running."""
    a = deployment["agent"]("agent-a")
    with a.saga(agent_id="agent-a", executor="inline") as ok:
        ok.call("reserve_inventory", {"sku": "IN1", "qty": 1})
    bad = a.saga(agent_id="agent-a", executor="inline")
    bad.call("reserve_inventory", {"sku": "IN2", "qty": 1})
    with pytest.raises(StepError):
        bad.call("fail_always", {})
    assert a.state(ok.saga_id).status is Status.COMMITTED
    assert a.state(bad.saga_id).status is Status.COMPENSATED
    assert [e[0] for e in effects()] == ["reserve", "reserve", "release"]


def test_what_an_agent_may_push_cannot_stop_or_misdirect_a_worker(
        deployment: dict[str, Any], tmp_path: Path) -> None:
    """The writes an agent user may make outside its namespace, and junk in its own
    index, aimed at the workers: names that are no agent in ss:agents, undecodable
    ids, its index listing another agent's saga, a job of its own whose data names
    another agent's saga. The workers refuse each, keep running, and run the next
    saga; the victim's log and schedule are untouched."""
    admin, a = deployment["admin"], deployment["agent"]("agent-a")
    ab = deployment["agent"]("agent-a-b")
    victim = ab.saga(agent_id="agent-a-b")  # open, nothing in flight
    names = names_of(admin)
    victim_log = admin.dump(names.log(victim.saga_id))
    victim_score = admin.zscore(names.active(victim.saga_id), victim.saga_id)
    r = a.redis
    odd = "agent-a_}:idem:x"  # a name whose index is a key of agent a's of another type
    r.sadd(keys.AGENTS, b"\xff", odd, "ledger", "agent-a")
    for index, agent in names.all_active([odd]):  # ss:{agent-a_}:idem:x_}:active
        if agent == odd:
            r.hset(index, "f", "v")
    # agent a's own index, listing the victim
    [own_index] = [index for index, agent in names.all_active(["agent-a"])
                   if agent == "agent-a"]
    r.zadd(own_index, {b"\xff\xfe": 0, victim.saga_id: 0, "ledger": 0})
    job = jobs.step_job_id("ab" * 32, 1, "agent-a_forged")
    jobs.push(r, jobs.STEP_QUEUE, job, jobs.STEP_FUNC, [victim.saga_id, 0, 1])
    log = tmp_path / "worker.log"
    with workers(deployment["env"], TOOLS, "--log-level", "INFO", log=log) as pool:
        sid = ab.submit(PLAN[:1], agent_id="agent-a-b")
        assert ab.wait(sid, timeout=60).status is Status.COMMITTED
        # a sweep has passed over the junk (it is due at once) and the worker lives on
        assert_eventually(lambda: admin.zscore(own_index, victim.saga_id) is None,
                          timeout=30, what="the sweeper to drop the foreign entry")
        assert pool[0].alive
    text = log.read_text()
    assert "refused job" in text
    assert "quitting" not in text
    assert admin.dump(names.log(victim.saga_id)) == victim_log
    assert admin.zscore(names.active(victim.saga_id), victim.saga_id) == victim_score


def of_namespace(ns: str, key: bytes) -> bool:
    """Whether ``key`` belongs to namespace ``ns`` (not ``ss``): its own keys, and
    RQ's keys of its queues, jobs and workers."""
    return key.startswith((f"{ns}:".encode(), f"rq:worker:{ns}.".encode())) or \
        f"{ns}-saga-".encode() in key


READS = {b"string": ("GET",), b"hash": ("HGETALL",), b"list": ("LRANGE", "0", "-1"),
         b"set": ("SMEMBERS",), b"zset": ("ZRANGE", "0", "-1"), b"stream": ("XRANGE", "-", "+")}


def test_each_namespace_s_users_keep_to_their_namespace(ledger: Path, tmp_path: Path) -> None:
    """Worker and agent users of namespaces shop-a and shop-b on one Redis, each
    applied as ``SAGA_NAMESPACE=... saga acl ... | redis-cli``: each namespace's
    workers (a pool of two) run its agent's sagas to commit, and unwind one,
    refused nothing. Then each user tries every read and write command on every
    key of the other namespace (its queues, queued jobs, workers, sagas, ledger)
    and to publish to its workers' channels: all refused, nothing changed."""
    namespaces = ("shop-a", "shop-b")
    with RedisServer() as srv:
        admin = redis.Redis.from_url(srv.url)
        for ns in namespaces:
            apply_as_readme(srv.port, ["worker", "--user", f"{ns}-worker"], f"{ns}-worker",
                            "w-pass", namespace=ns)
            apply_as_readme(srv.port, ["agent", "--agent", "agent-a", "--user",
                                       f"{ns}-agent"], f"{ns}-agent", "a-pass", namespace=ns)
        base = f"127.0.0.1:{srv.port}/0"
        plans = {}
        for name, steps in (("ok", PLAN), ("undone", [*PLAN[:1], {"tool": "fail_always",
                                                                  "args": {}}])):
            plans[name] = tmp_path / f"{name}.json"
            plans[name].write_text(json.dumps({"agent_id": "agent-a", "steps": steps}))

        def run(ns: str, plan: str, *wait: str) -> subprocess.CompletedProcess[str]:
            return cli(f"redis://{ns}-agent:a-pass@{base}", "run", "--tools", TOOLS,
                       str(plans[plan]), "--json", *wait, namespace=ns)
        log = tmp_path / "workers.log"
        with ExitStack() as pools, ThreadPoolExecutor(4) as pool:
            for ns in namespaces:
                pools.enter_context(workers(
                    {**os.environ, "SAGA_REDIS_URL": f"redis://{ns}-worker:w-pass@{base}",
                     "SAGA_NAMESPACE": ns, "SAGA_TEST_LEDGER": str(ledger), "PYTHONPATH": ROOT},
                    TOOLS, "-n", "2", "--log-level", "INFO", log=log))
            ran = {(ns, plan): pool.submit(run, ns, plan, "--wait", "--timeout", "60")
                   for ns in namespaces for plan in ("ok", "undone")}
            ends = {k: (done.result().returncode, done.result().stdout, done.result().stderr)
                    for k, done in ran.items()}
        for ns in namespaces:
            code, out, err = ends[ns, "ok"]
            assert (code, json.loads(out)["state"]) == (0, "committed"), err
            code, out, err = ends[ns, "undone"]
            assert json.loads(out)["state"] == "compensated", err
        log_text = log.read_text()
        assert "NOPERM" not in log_text, log_text[-3000:]
        assert "Traceback" not in log_text, log_text[-3000:]
        # the workers were refused no key or channel (CONFIG GET is refused, as it is
        # meant to be: the durability check reads "unknown" then)
        denied = [e for e in admin.acl_log() if e["reason"] in ("key", "channel")
                  and e["username"].endswith("-worker")]
        assert not denied, [(e["username"], e["object"], e["client-info"]) for e in denied]
        assert len(effects("reserve")) == 4
        assert len(effects("release")) == 2
        # a saga of each namespace waits in its queue, its job hash written
        for ns in namespaces:
            assert run(ns, "ok").returncode == 0
        for ns, other in (namespaces, namespaces[::-1]):
            theirs = [k for k in admin.scan_iter(count=1000) if of_namespace(other, k)]
            kinds = {k.split(b":")[1] for k in theirs if k.startswith(b"rq:")}
            assert {b"queue", b"job", b"worker", b"workers"} <= kinds, kinds
            assert any(k.startswith(f"{other}:".encode()) and k.endswith(b":log")
                       for k in theirs)
            before = {k: admin.dump(k) for k in theirs}
            channels = [f"rq:pubsub:{k.decode().split(':')[2]}" for k in theirs
                        if k.startswith(b"rq:worker:") and k.count(b":") == 2]
            assert channels
            for role in ("worker", "agent"):
                user = redis.Redis.from_url(f"redis://{ns}-{role}:{role[0]}-pass@{base}")
                allowed = [(k, cmd) for k in theirs for cmd, *args in
                           [*WRITES, READS[admin.type(k)], ("DUMP",), ("EXISTS",)]
                           if not refused(user, cmd, k, *args)]
                allowed += [(c, "PUBLISH") for c in channels
                            if not refused(user, "PUBLISH", c, '{"command": "shutdown"}')]
                assert not allowed, (ns, role, allowed[:10])
                assert refused(user, "BLPOP", jobs.queue_key(f"{other}-saga-steps"), 1)
            assert {k for k in theirs if admin.dump(k) != before[k]} == set()


def test_no_namespace_s_rq_patterns_cover_another_s() -> None:
    """Of namespaces whose names prefix each other (ss and its unprefixed RQ names,
    shop, shop-a, saga), no worker user's key or channel pattern matches a key of
    another's queues, jobs or workers; a namespace whose jobs would fall under
    another's patterns is refused."""
    names = ("ss", "shop", "shop-a", "saga")
    patterns = {}
    for ns in names:
        line = cli("redis://127.0.0.1:1/0", "acl", "worker", namespace=ns)
        assert line.returncode == 0, line.stderr
        patterns[ns] = re.findall(r"[~&]%?R?~?(rq:[^' ]+)", line.stdout)
        assert f"rq:worker:{ns}.*" in patterns[ns]

    def rq_keys(ns: str) -> list[str]:
        pre = "" if ns == "ss" else f"{ns}-"
        q, job = f"{pre}saga-steps", f"{pre}saga-step-agent-a_S1-1-{'ab' * 8}"
        return [f"rq:queue:{q}", f"rq:queue:{q}:intermediate", f"rq:wip:{q}",
                f"rq:workers:{q}", f"rq:job:{job}", f"rq:results:{job}",
                f"rq:job:{pre}saga-comp-agent-a_S1", f"rq:worker:{ns}.{'c' * 32}",
                f"rq:pubsub:{ns}.{'c' * 32}"]
    for ns in names:
        for key in rq_keys(ns):
            assert any(fnmatch.fnmatchcase(key, pat) for pat in patterns[ns]), (ns, key)
        for other in names:
            if other != ns:
                covered = [(key, pat) for key in rq_keys(other) for pat in patterns[ns]
                           if fnmatch.fnmatchcase(key, pat)]
                assert not covered, (ns, other, covered)
    for bad in ("saga-step-x", "shop-saga-comp-1"):
        with pytest.raises(InvalidInput, match="saga-step"):
            keys.namespace(bad)
