"""The wire of ``saga mcp-guard``: a JSON-RPC relay between an MCP client and the
downstream server that parses every message but rebuilds only what it changes.

What the relay does with each message:

- ``tools/call`` from the client: a saga step (:class:`~saga_store.gateway.Gateway`);
  the gateway calls downstream with a request id of its own and answers the
  client with the server's own result, or, when the call failed or was refused,
  a tool error that says what was rolled back;
- ``tools/list`` from the client: forwarded; the answer comes back with each
  tool's reversibility in its description and the session tools added;
- everything else (initialize, ping, resources, prompts, notifications, the
  server's own requests to the client and their answers) passes through as the
  bytes it came as, so the client and the server negotiate directly;
- a JSON-RPC batch is taken apart: each of its messages is handled exactly as if
  it came alone, and the answers to its requests go back together as one batch.

After the client's ``notifications/initialized`` (and before any call is
served) the gateway lists the downstream's tools itself and finishes what a
previous gateway for the same downstream left unfinished.

Stdio downstreams are spoken to over their pipes directly; a Streamable-HTTP
one through the MCP SDK's transport (both in :mod:`saga_store.mcp_downstream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from saga_store.errors import InvalidInput
from saga_store.log.canonical import loads
from saga_store.mcp.cancel import REASON, RUNNING, Cancellation
from saga_store.mcp.downstream import (
    LINE_LIMIT,
    STOP_GRACE_S,
    DownstreamGone,
    Inbox,
    Lines,
    PipeDownstream,
    SdkDownstream,
    line_of,
)
from saga_store.mcp.gateway import SESSION_TOOLS, CallFn, Gateway, session_tools
from saga_store.mcp.results import CallOutcome, client_error, client_result, result_text

log = logging.getLogger("saga_store.gateway")
OWN = "saga-guard-"  # the ids of the gateway's own requests downstream start so
Reply = Callable[[dict[str, Any]], Awaitable[None]]


class Batch:
    """The answers to one client batch's requests, sent back together once all are in."""

    def __init__(self, relay: Relay, expected: int) -> None:
        self.relay, self.expected, self.answers = relay, expected, list[dict[str, Any]]()

    async def reply(self, msg: dict[str, Any]) -> None:
        self.answers.append(msg)
        if len(self.answers) == self.expected:
            await self.relay.to_client(line_of(self.answers))


class ClientPipe(asyncio.Protocol):
    """The client's stdin, split into lines as bytes arrive. While nothing read
    earlier is still waiting or being acted on, a line ``now`` takes (a
    ``tools/call``) is acted on in the same turn of the event loop; every other
    line is read, in order, from :meth:`lines`. A line over ``LINE_LIMIT`` bytes
    is skipped: :meth:`lines` gives None in its place."""

    def __init__(self) -> None:
        self.now: Callable[[bytes], bool] = lambda line: False
        self._queue: Inbox[bytes | None] = Inbox()
        self._lines = Lines()
        self._busy = False  # the reader of lines() is acting on a line

    def data_received(self, data: bytes) -> None:
        if self._queue.ended:  # told to stop: what comes after is not read
            return
        for line in self._lines.feed(data):
            if line is None:  # over the limit: the reader answers it
                self._queue.put(None)
            else:
                self._line(line)

    def _line(self, line: bytes) -> None:
        if self._queue or self._busy or not self.now(line):
            self._queue.put(line)

    def eof_received(self) -> bool:
        if (rest := self._lines.end()) is not None:
            self._line(rest)
        self.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.end()

    def end(self) -> None:
        """No more lines: the client closed its end (or the gateway was told to stop)."""
        self._queue.end()

    async def lines(self) -> AsyncIterator[bytes | None]:
        while await self._queue.ready():
            self._busy = True
            try:
                yield self._queue.popleft()
            finally:
                self._busy = False


class Relay:
    """One client session: reads the client's lines, writes to ``client_out``."""

    def __init__(self, gateway: Callable[[CallFn], Gateway],
                 downstream: PipeDownstream | SdkDownstream,
                 client_out: Callable[[bytes], Awaitable[None]]) -> None:
        self.gateway = gateway(self.call)  # it reaches the downstream through the relay
        self.gateway.to_client = self._answer  # e.g. progress while a call waits
        self.gateway.call_task, self.gateway.task_result = self.call_task, self.task_result
        self.down, self._out = downstream, client_out
        # unguessable, so no id a client picks is taken for one of the gateway's own
        self._prefix, self._ids = f"{OWN}{os.urandom(6).hex()}-", itertools.count(1)
        self._own: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._routes: dict[bytes, Reply] = {}  # forwarded requests answered into a batch
        # forwarded tools/list requests: where the answer goes, and if it is a first page
        self._listing: dict[bytes, tuple[Reply, bool]] = {}
        self._calls: dict[bytes, asyncio.Task[None]] = {}  # tools/call in flight
        self._cancels: dict[bytes, Cancellation] = {}  # how the client may cancel each
        self._ready = False
        self.gone = False  # the downstream went away
        if isinstance(downstream, PipeDownstream):  # answers to the gateway's own requests
            downstream.answers_at_once(self._own_answer)  # skip the pump's turn

    # -- the two directions ------------------------------------------------------

    async def serve(self, lines: AsyncIterator[bytes | None]) -> None:
        """Relay until the client's input ends (or the downstream goes), then close the
        session's saga: committed if every call has an outcome, else rolled back."""
        pump = asyncio.create_task(self._pump())
        reader = asyncio.create_task(self._read(lines))
        keeper = asyncio.create_task(self.gateway.keep_alive())
        await asyncio.wait({pump, reader}, return_when=asyncio.FIRST_COMPLETED)
        self.gateway.closing = True  # a call waiting for approval withdraws its request
        reader.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            pass
        except DownstreamGone:  # e.g. it died while the gateway listed its tools
            log.warning("the downstream server went away; ending the session")
        if self._calls:  # calls in flight finish (or, after a grace, are cut off)
            _, late = await asyncio.wait(set(self._calls.values()), timeout=STOP_GRACE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            await self._close_saga()
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            self.gateway.leases.release()  # what is left unfinished, the next gateway takes at once
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump

    async def _read(self, lines: AsyncIterator[bytes | None]) -> None:
        async for line in lines:
            if line is None:
                log.warning("the client sent a message over %d bytes; skipped", LINE_LIMIT)
                await self._answer(_error(None, -32700, f"a message over {LINE_LIMIT} bytes "
                                                        "was skipped"))
            elif line.strip():
                await self.from_client(line)

    async def from_client(self, line: bytes) -> None:
        try:
            msg = loads(line, "message")
        except InvalidInput as exc:
            await self._answer(_error(None, -32700, f"parse error: {exc}"))
            return
        if not isinstance(msg, list):
            await self._one(msg, line if line.endswith(b"\n") else line + b"\n", None)
            return
        if not msg:
            await self._answer(_error(None, -32600, "empty batch"))
            return
        # one answer per request, and per element that is not a message at all
        batch = Batch(self, sum(1 for m in msg if not isinstance(m, dict) or (
            "method" in m and "id" in m)))
        for m in msg:
            await self._one(m, None, batch)

    async def _one(self, msg: Any, raw: bytes | None, batch: Batch | None) -> None:
        reply = batch.reply if batch is not None else self._answer
        if not isinstance(msg, dict):
            await reply(_error(None, -32600, "a JSON-RPC message is an object"))
            return
        method = msg.get("method")
        if method is None or "id" not in msg:  # an answer or a notification
            if method == "notifications/cancelled" and await self._cancelled(msg):
                return  # the server knows the call by the gateway's id: told, if it runs
            await self.down.send(msg, raw)
            if method == "notifications/initialized":
                await self._start()
            return
        if method == "tools/call":
            await self._start()
            self._call(msg, reply)
            return
        if method == "tools/list":
            await self._start()
            params = msg.get("params")
            first = not (isinstance(params, dict) and params.get("cursor"))
            self._listing[_key(msg["id"])] = (reply, first)
        elif batch is not None:
            self._routes[_key(msg["id"])] = reply
        await self.down.send(msg, raw)

    def take_now(self, line: bytes) -> bool:
        """Start a single ``tools/call`` at once, without waiting for the reader's
        turn; False for anything else (and before the session has started)."""
        if not self._ready or b'"tools/call"' not in line:  # the rest is parsed once, later
            return False
        try:
            msg = loads(line, "message")
        except InvalidInput:
            return False
        if not (isinstance(msg, dict) and msg.get("method") == "tools/call" and "id" in msg):
            return False
        self._call(msg, self._answer)
        return True

    def _call(self, msg: dict[str, Any], reply: Reply) -> None:
        key = _key(msg["id"])
        self._cancels[key] = Cancellation()
        self._calls[key] = asyncio.create_task(self._tool_call(key, msg, reply))

    async def _pump(self) -> None:
        """Everything the downstream writes: answers to the gateway's own requests,
        to tools/list, to a batch's requests; the rest goes to the client as is."""
        try:
            while (got := await self.down.receive()) is not None:
                msg, raw = got
                if self._own_answer(msg):
                    continue
                rid = msg.get("id") if isinstance(msg, dict) and "method" not in msg else None
                if rid is not None and (listing := self._listing.pop(_key(rid), None)):
                    await listing[0](self._listed(msg, first_page=listing[1]))
                    continue
                if rid is not None and (reply := self._routes.pop(_key(rid), None)):
                    await reply(msg)
                    continue
                await self.to_client(raw if raw is not None else orjson.dumps(msg) + b"\n")
        finally:
            self.gone = True
            for fut in self._own.values():
                if not fut.done():
                    fut.set_exception(DownstreamGone("the downstream server went away"))
            self._own.clear()

    def _own_answer(self, msg: Any) -> bool:
        """Whether ``msg`` answers one of the gateway's own requests; if so, it goes
        to the request's waiter (gone if its caller gave up waiting)."""
        rid = msg.get("id") if isinstance(msg, dict) and "method" not in msg else None
        if not (isinstance(rid, str) and rid.startswith(self._prefix)):
            return False
        fut = self._own.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)
        return True

    async def to_client(self, data: bytes) -> None:
        await self._out(data)

    async def _answer(self, msg: dict[str, Any]) -> None:
        await self.to_client(line_of(msg))

    # -- what the gateway changes -----------------------------------------------

    async def _start(self) -> None:
        """Once, before serving any call: learn the tools, finish what an earlier
        gateway for this downstream left."""
        if self._ready:
            return
        self._ready = True
        self.gateway.set_tools(await self.list_tools())
        for sid, how in await self.gateway.recover():
            log.warning("finished saga %s left by an earlier gateway: %s", sid, how)

    async def list_tools(self) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            reply = await self.request("tools/list", {"cursor": cursor} if cursor else {})
            result = reply.get("result") or {}
            tools += [_tool(t) for t in result.get("tools") or []]
            cursor = result.get("nextCursor")
            if not cursor:
                return tools

    async def _learn_tools(self) -> None:
        """List the server's tools again: a call named one the gateway does not know
        (added since, with or without a tools/list_changed the client acted on)."""
        with contextlib.suppress(DownstreamGone):
            self.gateway.set_tools(await self.list_tools())

    def _listed(self, msg: dict[str, Any], first_page: bool) -> dict[str, Any]:
        """The downstream's tools/list answer as the client sees it; a first page
        replaces what the gateway knew of the tools, later pages add to it."""
        result = msg.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return msg  # an error: the client gets it as it is
        tools = [t for t in result["tools"] if isinstance(t, dict)]
        models = [_tool(t) for t in tools]
        if first_page:
            self.gateway.set_tools(models)
        else:
            self.gateway.learn(models)
        for t, model in zip(tools, models, strict=True):
            t["description"] = self.gateway.describe(model)
        if not result.get("nextCursor"):  # the session tools close the last page
            tools += session_tools()
        return {**msg, "result": {**result, "tools": tools}}

    async def _tool_call(self, key: bytes, msg: dict[str, Any], reply: Reply) -> None:
        try:
            await self._call_tool(msg, reply)
        finally:  # not a done callback: that would cost the event loop a turn per call
            if self._calls.get(key) is asyncio.current_task():
                del self._calls[key]
                self._cancels.pop(key, None)

    async def _call_tool(self, msg: dict[str, Any], reply: Reply) -> None:
        rid, params = msg["id"], msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            await reply(_error(rid, -32602, "tools/call needs params.name, the tool's name"))
            return
        args, meta = params.get("arguments") or {}, params.get("_meta")
        name = params["name"]
        if self.gateway.tools and name not in self.gateway.tools and name not in SESSION_TOOLS:
            await self._learn_tools()  # once, before a name is refused as unknown
        if not isinstance(args, dict) or not (meta is None or isinstance(meta, dict)):
            await reply(_error(rid, -32602, "tools/call params.arguments and params._meta "
                                            "are objects"))
            return
        task = params.get("task")
        if not (task is None or isinstance(task, dict)):
            await reply(_error(rid, -32602, "tools/call params.task is an object"))
            return
        answered = False
        cancel = self._cancels.get(_key(rid))

        async def answer(out: CallOutcome) -> None:  # the server made the call a task
            nonlocal answered
            if cancel is not None and cancel.requested:
                return
            answered = True
            await reply({"jsonrpc": "2.0", "id": rid, "result": out.raw})

        try:
            out = await self.gateway.handle(params["name"], args, meta, task, answer, cancel)
        except Exception as exc:  # e.g. Redis went away: the log says how far it got
            if answered or (cancel is not None and cancel.requested):
                # the client has its task, or wants no answer; the log says how it ended
                log.exception("tools/call %s (a task) failed in the gateway", params["name"])
                return
            log.exception("tools/call %s failed in the gateway", params["name"])
            await reply(_error(rid, -32603, f"the gateway could not keep the call's record "
                                            f"({type(exc).__name__}: {exc}); the next gateway "
                                            "for this server settles the session"))
            return
        if cancel is not None and cancel.requested:
            log.info("tools/call %s was cancelled by the client: %s", params["name"],
                     out.text[:300])
            return  # MCP: a cancelled request is not answered
        if answered:
            return
        if out.error is not None:  # the server's own JSON-RPC error, as it sent it
            await reply({"jsonrpc": "2.0", "id": rid, "error": client_error(out)})
        else:
            await reply({"jsonrpc": "2.0", "id": rid, "result": client_result(out)})

    async def _cancelled(self, msg: dict[str, Any]) -> bool:
        """Act on a client's ``notifications/cancelled`` for a tools/call in flight
        (:mod:`saga_store.mcp.cancel`); False if it names no such call."""
        params = msg.get("params")
        cancel = self._cancels.get(_key(params.get("requestId"))) \
            if isinstance(params, dict) else None
        if cancel is None:
            return False
        rid = cancel.cancel()
        if rid is not None and not self.gone:  # it runs downstream: the server is told
            reason = params.get("reason") if isinstance(params, dict) else None
            with contextlib.suppress(DownstreamGone):
                await self.down.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                      "params": {"requestId": rid,
                                                 "reason": reason or REASON}})
        return True

    # -- the gateway's own requests ---------------------------------------------

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.gone:
            raise DownstreamGone("the downstream server went away")
        rid = f"{self._prefix}{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._own[rid] = fut
        if (running := RUNNING.get()) is not None:  # a client's call: it may cancel it
            running.downstream_id = rid
        try:
            await self.down.send({"jsonrpc": "2.0", "id": rid, "method": method,
                                  "params": params})
            return await fut
        finally:
            self._own.pop(rid, None)

    async def call(self, name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallOutcome:
        """The gateway's way to reach the downstream (see :data:`~.gateway.CallFn`)."""
        return _outcome(await self.request("tools/call", {"name": name, "arguments": args,
                                                          "_meta": meta}))

    async def call_task(self, name: str, args: dict[str, Any], meta: dict[str, Any],
                        task: dict[str, Any]) -> CallOutcome:
        """A task-augmented call: its answer names the task the server made of it."""
        reply = await self.request("tools/call", {"name": name, "arguments": args,
                                                  "_meta": meta, "task": task})
        created = reply.get("result")
        made = created.get("task") if isinstance(created, dict) else None
        if isinstance(made, dict) and isinstance(made.get("taskId"), str):
            return CallOutcome(True, None, "", raw=created, task_id=made["taskId"])
        return _outcome(reply)  # the server answered at once (or refused)

    async def task_result(self, task_id: str) -> CallOutcome:
        """What a task ended with (``tasks/result`` waits for its end)."""
        return _outcome(await self.request("tasks/result", {"taskId": task_id}))

    async def _close_saga(self) -> None:
        try:
            closed = self.gateway.commit()
        except InvalidInput:
            if self.gone:  # nothing to compensate through: the next gateway finishes it
                log.warning("the downstream went away with a call unsettled; the next "
                            "gateway for it rolls the session back")
                return
            closed = await self.gateway.abort("the client's session ended with a call "
                                              "unsettled")
        if closed:
            log.info("session ended; saga %s closed", closed)


def _outcome(reply: dict[str, Any]) -> CallOutcome:
    """A ``tools/call`` (or ``tasks/result``) answer as the gateway reads it."""
    result = reply.get("result")
    if not isinstance(result, dict):  # a JSON-RPC error: the server refused the call
        err = reply.get("error")
        err = err if isinstance(err, dict) else {"code": -32603, "message": "no result"}
        return CallOutcome(False, None, f"{err.get('message', 'no result')} "
                                        f"(JSON-RPC error {err.get('code')})", error=err)
    content = result.get("content")
    return CallOutcome(not result.get("isError"), result.get("structuredContent"),
                       result_text(content), raw=result,
                       content=content if isinstance(content, list) else None)


def _key(rid: Any) -> bytes:
    return line_of(rid)


def _error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _tool(raw: dict[str, Any]) -> Any:
    """A listed tool as the SDK's model, for classification; a tool the SDK cannot
    read is still known by name (and classified as unknown unless the tools map says)."""
    import mcp_types as types
    from pydantic import ValidationError
    try:
        return types.Tool.model_validate(raw)
    except ValidationError as exc:
        log.warning("tool %r does not read as an MCP tool (%s); classified by name only",
                    raw.get("name"), exc.error_count())
        return types.Tool(name=str(raw.get("name")), input_schema={"type": "object"})

