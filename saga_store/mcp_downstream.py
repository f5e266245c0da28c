"""The MCP gateway's downstream: a server it started (its pipes, spoken to
directly) or one reached over Streamable HTTP (through the MCP SDK's
transport). Both give and take JSON-RPC messages as dicts; a pipe also hands
over each message's line, so what the relay does not change goes on as the
bytes it came as."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import orjson

from .errors import InvalidInput

log = logging.getLogger("saga_store.gateway")
LINE_LIMIT = 64 * 1024 * 1024
STOP_GRACE_S = 5.0


def downstream_env(env: Mapping[str, str]) -> dict[str, str]:
    """The server runs in the gateway's environment, as if the client had started
    it, minus Saga Store's own settings: the Redis URL carries a password and the
    HMAC key would let the server forge the chain it is being watched by."""
    return {k: v for k, v in env.items() if not k.startswith("SAGA_")}


class DownstreamGone(ConnectionError):
    pass


class PipeDownstream:
    """A downstream MCP server started as a child process, spoken to over its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ended = False  # its output ended

    @classmethod
    async def start(cls, command: list[str]) -> PipeDownstream:
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=downstream_env(os.environ), limit=LINE_LIMIT)
        except OSError as exc:
            raise InvalidInput(f"cannot start the downstream server {command[0]!r}: {exc}. "
                               "Check the command after --") from None
        return cls(proc)

    async def send(self, msg: dict[str, Any], raw: bytes | None = None) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if stdin.is_closing():
            raise DownstreamGone("the downstream server's stdin is closed")
        try:
            stdin.write(raw if raw is not None else orjson.dumps(msg) + b"\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise DownstreamGone(f"the downstream server went away ({exc})") from None

    async def receive(self) -> tuple[Any, bytes | None] | None:
        """The next message (parsed, and its line), or None when the server is gone."""
        stdout = self.proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            try:
                return orjson.loads(line), line if line.endswith(b"\n") else line + b"\n"
            except orjson.JSONDecodeError:
                log.warning("the downstream wrote a line that is not JSON; skipped: %.200r",
                            line)
        self.ended = True
        return None

    async def close(self) -> None:
        ended_first = self.ended  # its output ended before the session did
        stdin = self.proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if ended_first and self.proc.returncode:
            log.warning("the downstream server exited with code %s; see its stderr above",
                        self.proc.returncode)


class SdkDownstream:
    """A downstream reached through an MCP SDK transport's message streams (used for
    Streamable HTTP)."""

    def __init__(self, read: Any, write: Any) -> None:
        self.read, self.write = read, write

    async def send(self, msg: dict[str, Any], raw: bytes | None = None) -> None:
        from mcp.shared.message import SessionMessage
        from mcp_types.jsonrpc import jsonrpc_message_adapter
        await self.write.send(SessionMessage(jsonrpc_message_adapter.validate_python(msg)))

    async def receive(self) -> tuple[Any, bytes | None] | None:
        import anyio
        while True:
            try:
                item = await self.read.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return None
            if isinstance(item, Exception):
                log.warning("the downstream transport reported: %s", item)
                continue
            return item.message.model_dump(by_alias=True, mode="json",
                                           exclude_unset=True), None
