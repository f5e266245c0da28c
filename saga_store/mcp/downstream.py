"""The MCP gateway's downstream: a server it started (its pipes, spoken to
directly) or one reached over Streamable HTTP (through the MCP SDK's
transport). Both give and take JSON-RPC messages as dicts; a pipe also hands
over each message's line, so what the relay does not change goes on as the
bytes it came as."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from saga_store.errors import InvalidInput

log = logging.getLogger("saga_store.gateway")
T = TypeVar("T")
LINE_LIMIT = 64 * 1024 * 1024
STOP_GRACE_S = 5.0


def downstream_env(env: Mapping[str, str]) -> dict[str, str]:
    """The server runs in the gateway's environment, as if the client had started
    it, minus Saga Store's own settings: the Redis URL carries a password and the
    HMAC key would let the server forge the chain it is being watched by."""
    return {k: v for k, v in env.items() if not k.startswith("SAGA_")}


class DownstreamGone(ConnectionError):
    pass


def line_of(msg: Any) -> bytes:
    """``msg`` as one line of JSON. A client's message is read with its numbers as
    written (:func:`~saga_store.log.canonical.loads`); orjson refuses to write an
    integer beyond 64 bits, so such a message goes on through the standard library,
    the number unchanged."""
    try:
        return orjson.dumps(msg) + b"\n"
    except TypeError:
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class Lines:
    """Bytes as they arrive, split into newline-ended lines. A line over
    ``LINE_LIMIT`` bytes is dropped, as it comes, and stands as None."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = False  # in the rest of a line over the limit

    def feed(self, data: bytes) -> list[bytes | None]:
        buf = self._buf
        buf += data
        out: list[bytes | None] = []
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            if self._skip:
                self._skip = False
            else:
                out.append(bytes(buf[start:end + 1]) if end - start <= LINE_LIMIT else None)
            start = end + 1
        del buf[:start]
        if len(buf) > LINE_LIMIT:
            buf.clear()
            if not self._skip:
                self._skip = True
                out.append(None)
        return out

    def end(self) -> bytes | None:
        """What is left at the end of the input: a last line without its newline."""
        rest = bytes(self._buf) if self._buf and not self._skip else None
        self._buf.clear()
        return rest


class Inbox(deque[T]):
    """What a protocol read, in arrival order, for one reader that awaits it."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = False  # nothing more will come
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self.append(item)
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    async def ready(self) -> bool:
        """Wait for an item; False once none is left and none will come."""
        while not self:
            if self.ended:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return True

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _ServerPipes(asyncio.SubprocessProtocol):
    """The server's stdout split into lines and parsed as bytes arrive. A message
    ``take`` accepts (the answer to one of the gateway's own requests) is handed
    over at once, in the same turn of the event loop; the rest wait for
    :meth:`PipeDownstream.receive`."""

    def __init__(self) -> None:
        self.take: Callable[[Any], bool] = lambda msg: False
        self.pending: Inbox[tuple[Any, bytes]] = Inbox()  # ended: its stdout closed
        self._lines = Lines()
        self._writable: asyncio.Future[None] | None = None  # set while writes are paused
        self.exited = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        for line in self._lines.feed(data):
            if line is None:
                log.warning("the downstream wrote a line over %d bytes; skipped", LINE_LIMIT)
            else:
                self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("the downstream wrote a line that is not JSON; skipped: %.200r", line)
            return
        if not self.take(msg):
            self.pending.put((msg, line if line.endswith(b"\n") else line + b"\n"))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            if (rest := self._lines.end()) is not None:
                self._line(rest)
            self.pending.end()
        elif fd == 0:
            self.resume_writing()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def writable(self) -> None:
        if self._writable is not None:
            await self._writable



class PipeDownstream:
    """A downstream MCP server started as a child process, spoken to over its pipes."""

    def __init__(self, transport: asyncio.SubprocessTransport, pipes: _ServerPipes) -> None:
        self.transport, self.pipes = transport, pipes

    @property
    def ended(self) -> bool:
        return self.pipes.pending.ended  # its output ended

    def answers_at_once(self, take: Callable[[Any], bool]) -> None:
        """Hand each message ``take`` accepts to it as soon as it is read."""
        self.pipes.take = take

    @classmethod
    async def start(cls, command: list[str]) -> PipeDownstream:
        loop = asyncio.get_running_loop()
        try:
            transport, pipes = await loop.subprocess_exec(
                _ServerPipes, *command, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=None, env=downstream_env(os.environ))
        except OSError as exc:
            raise InvalidInput(f"cannot start the downstream server {command[0]!r}: {exc}. "
                               "Check the command after --") from None
        return cls(transport, pipes)

    async def send(self, msg: dict[str, Any], raw: bytes | None = None) -> None:
        stdin = self.transport.get_pipe_transport(0)
        if not isinstance(stdin, asyncio.WriteTransport) or stdin.is_closing():
            raise DownstreamGone("the downstream server's stdin is closed")
        stdin.write(raw if raw is not None else line_of(msg))
        await self.pipes.writable()

    async def receive(self) -> tuple[Any, bytes | None] | None:
        """The next message (parsed, and its line) that was not handed over at once,
        or None when the server is gone."""
        pending = self.pipes.pending
        return pending.popleft() if await pending.ready() else None

    async def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Close the server's stdin; after ``grace_s`` SIGTERM it, after as long
        again SIGKILL it."""
        ended_first = self.ended  # its output ended before the session did
        stdin = self.transport.get_pipe_transport(0)
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.pipes.exited), grace_s)
        except TimeoutError:
            self.transport.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(self.pipes.exited), grace_s)
            except TimeoutError:
                self.transport.kill()
                await self.pipes.exited
        code = self.transport.get_returncode()
        self.transport.close()
        if ended_first and code:
            log.warning("the downstream server exited with code %s; see its stderr above", code)


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
