# Every target builds its own virtual environment, so a fresh clone needs
# nothing but python3 (and redis-server for the test suite, installed by CI).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-real test-parity test-cluster lint typecheck bench bench-peers bench-cluster bench-soak bench-verify-memory bench-demo chaos clean \
	example-openai-agents example-pydantic-ai example-langgraph example-anthropic

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# the demo needs only the core install (the embedded store is part of it): a venv
# of its own, not the 546 MB of .[dev], so a fresh clone runs it in seconds
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
# python3's own pip installs into a venv made without one (ensurepip takes longer
# than the rest); a python3 with no pip of its own gets the usual venv
$(DEMO_STAMP): pyproject.toml
	if $(PY) -m pip --version >/dev/null 2>&1; then \
		$(PY) -m venv --without-pip $(DEMO_VENV) && \
		$(PY) -m pip --python $(DEMO_VENV)/bin/python install -q -e .; \
	else \
		$(PY) -m venv $(DEMO_VENV) && $(DEMO_VENV)/bin/pip install -q -e .; \
	fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/saga demo

# one agent per framework, its tool calls a saga; a scripted model offline, a real
# one when its API key is set (OPENAI_API_KEY / ANTHROPIC_API_KEY). The embedded
# store unless SAGA_REDIS_URL names a Redis (then with a worker process).
example-openai-agents: $(STAMP)
	$(BIN)/python -m examples.openai_agents_shop

example-pydantic-ai: $(STAMP)
	$(BIN)/python -m examples.pydantic_ai_shop

example-langgraph: $(STAMP)
	$(BIN)/python -m examples.langgraph_shop

example-anthropic: $(STAMP)
	$(BIN)/python -m examples.anthropic_shop

# four runs: everything on one Redis (stores of layout 3, the default), with every
# script and transaction checked to keep to one hash slot; the worker flows, crash
# windows and ACL users again on stores of layout 2 (existing stores keep it until
# 'saga migrate --to 3'); the log tests on the embedded store, of layout 2; the tests
# marked cluster with the log on a private six-node Redis Cluster and RQ's queues on
# a standalone Redis. Each run spreads its tests over TEST_PROCS processes (pytest-xdist), each with
# its own servers: most tests wait on processes and timeouts, not on the CPU.
# TEST_PROCS=0 runs them one at a time; 4 is faster still on two cores, but loads
# them enough that the timing of a test's own helpers shows (four such races are
# fixed; two processes keep the load near what the suite was written under).
TEST_PROCS ?= 2
LAYOUT2_TESTS = tests/execution/test_execution.py tests/execution/test_crash_windows.py \
	tests/execution/test_agent_acl.py tests/execution/test_hardening.py
SLOT_LOG := $(abspath $(VENV))/slots.log
XDIST = $(if $(filter 0,$(TEST_PROCS)),,-n $(TEST_PROCS) --dist worksteal)
test: $(STAMP)
	rm -f $(SLOT_LOG)*
	SAGA_TEST_SLOT_LOG=$(SLOT_LOG) $(BIN)/python -m pytest -q -rfs -p no:cacheprovider $(XDIST)
	SAGA_TEST_LAYOUT="2 1024" $(BIN)/python -m pytest -q -rfs -p no:cacheprovider $(XDIST) \
		$(LAYOUT2_TESTS)
	SAGA_TEST_LAYOUT="2 1024" SAGA_TEST_BACKEND=fakeredis $(BIN)/python -m pytest -q -rfs \
		-p no:cacheprovider -m parity $(XDIST)
	SAGA_TEST_BACKEND=cluster $(BIN)/python -m pytest -q -rfs -p no:cacheprovider -m cluster $(XDIST)

test-cluster: $(STAMP)
	SAGA_TEST_BACKEND=cluster $(BIN)/python -m pytest -q -rfs -p no:cacheprovider -m cluster $(XDIST)

lint: $(STAMP)
	$(BIN)/ruff check saga_store workers cli tests benchmarks examples
	$(BIN)/mypy

bench: $(STAMP)
	QUICK=$(QUICK) $(BIN)/python -m benchmarks.run_all

# the peer workload on Saga Store (appendfsync everysec and always), Restate, DBOS and
# the in-memory engine, interleaved: QUICK=1 for one round at n=50, ROUNDS=5 for more,
# PEERS_ARGS for any other flag of benchmarks/bench_peers.py. Needs npm (restate-server
# is installed into .cache/npm-restate on first run) and PostgreSQL on 127.0.0.1:5432;
# an engine that cannot start is skipped with its reason.
PEERS_STAMP := $(VENV)/.installed-peers
ROUNDS ?= 3
$(PEERS_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,peers]'
	touch $(PEERS_STAMP)

# one Redis (with a replica) beside a 3-master cluster (each with a replica), in
# interleaved rounds: appends, the 5-step workflow, ledger sealing, the ledger's
# spread over buckets and masters (QUICK=1: one small round)
bench-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.bench_cluster --rounds $(ROUNDS) $(if $(filter 1,$(QUICK)),--quick)

# Redis memory over a soak: 50 sagas/s of 3-step plans through an asyncio worker,
# `saga archive --closed-before 5m --every 30s` beside it, used_memory sampled every
# 10 s (SOAK_MINUTES=20 by default; about that long; memory, not CPU)
SOAK_MINUTES ?= 20
bench-soak: $(STAMP)
	$(BIN)/python -m benchmarks.bench_soak --minutes $(SOAK_MINUTES)

# saga verify's peak RSS and time on one store of VERIFY_SAGAS, whole and in groups of
# buckets (memory, not CPU)
VERIFY_SAGAS ?= 100000
bench-verify-memory: $(STAMP)
	$(BIN)/python -m benchmarks.bench_verify_memory --sagas $(VERIFY_SAGAS) --groups 0,15000

# saga demo with real workers, timed (median of 5) against its 10 s target
bench-demo: $(STAMP)
	$(BIN)/python -m benchmarks.bench_demo --runs 5

bench-peers: $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.bench_peers --rounds $(ROUNDS) $(if $(filter 1,$(QUICK)),--quick) $(PEERS_ARGS)

# the chaos soak at full size (SAGAS=400 for a short one); the suite runs a short one
SAGAS ?= 10000
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos --sagas $(SAGAS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) build *.egg-info
