"""A gateway's lease on one host, judged from another (``python -m tests.lease_probe``).

``hold URL SAGA_ID``: claim the saga's lease as a gateway does, print whether it
was claimed and the token, then hold it (a minute at most) until killed.
``claim URL SAGA_ID TOKEN``: print, as JSON, whether the holder of ``TOKEN`` is
gone as seen from here, whether its pid exists here, and whether a claim of the
saga's lease succeeds."""

from __future__ import annotations

import json
import os
import sys
import time

from saga_store.log.layout import names_of
from saga_store.mcp.holders import holder_gone
from saga_store.mcp.leases import Leases
from saga_store.ops.connection import connect

TTL_MS = 60_000


def main(argv: list[str]) -> None:
    what, url, saga_id, *rest = argv
    client = connect(url)
    leases = Leases(client, "gateway", TTL_MS, names_of(client))
    if what == "hold":
        print(leases.claim(saga_id), leases.token, flush=True)
        time.sleep(TTL_MS / 1000)
        return
    [token] = rest
    pid = token.split("/")[-2]
    print(json.dumps({"gone": holder_gone(token), "pid_here": os.path.exists(f"/proc/{pid}"),
                      "claimed": leases.claim(saga_id)}))


if __name__ == "__main__":
    main(sys.argv[1:])
