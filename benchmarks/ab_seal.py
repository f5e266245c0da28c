"""Ledger sealing throughput of the checkout in the current folder: N copies of a
real saga close pending, then one seal, timed. Run it in two checkouts one after
the other, alternating, to compare them:

    (cd /tmp/before && python /path/to/benchmarks/ab_seal.py 90000)
    python benchmarks/ab_seal.py 90000
"""

import sys
import time

sys.path.insert(0, ".")  # the checkout in the current folder
import redis

from saga_store.testing import RedisServer

try:
    from saga_store.log.ledger import Ledger
    from saga_store.log.store import EventStore as S
except ImportError:
    from saga_store.ledger import Ledger
    from saga_store.store import Store as S
from saga_store import keys
from tests.helpers import committed_saga

N = int(sys.argv[1])
with RedisServer(appendfsync="everysec") as srv:
    c = redis.Redis.from_url(srv.url)
    st = S(c)
    st.ledger.deferred = True
    w = committed_saga(st)
    layout = getattr(st.log, "layout", None)  # checkouts before ledger buckets have none
    pending = keys.ledger_pending(layout.ledger_of(w.saga_id)) if layout else \
        keys.LEDGER_PENDING
    ent = c.lindex(pending, -1)
    st.ledger.flush()
    p = c.pipeline(transaction=False)
    for _ in range(N):
        p.rpush(pending, ent)
    p.execute()
    t = time.perf_counter()
    n = Ledger(st.log).seal()
    dt = time.perf_counter() - t
    print(f"{n} entries sealed in {dt:.2f} s: {n/dt:.0f}/s")
