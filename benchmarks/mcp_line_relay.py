"""The floor of any Python stdio gateway: a process between client and server
that forwards bytes both ways on asyncio's pipe transports, parsing nothing and
logging nothing. Measured beside ``saga mcp-guard``, it splits the gateway's
overhead into the extra process hop itself and the gateway's own work.

    python benchmarks/mcp_line_relay.py COMMAND ARGS...
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


class _Forward(asyncio.Protocol):
    def __init__(self, to: Any, done: asyncio.Future[None]) -> None:
        self.to, self.done = to, done

    def data_received(self, data: bytes) -> None:
        self.to().write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Child(asyncio.SubprocessProtocol):
    def __init__(self, out: Any, done: asyncio.Future[None]) -> None:
        self.out, self.done = out, done

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.out.write(data)

    def process_exited(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def main(command: list[str]) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
    child, _ = await loop.subprocess_exec(lambda: _Child(out, done), *command, stderr=None)
    await loop.connect_read_pipe(lambda: _Forward(lambda: child.get_pipe_transport(0), done),
                                 sys.stdin.buffer)
    await done
    child.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
