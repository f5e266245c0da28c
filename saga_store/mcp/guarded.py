"""The MCP gateway in the agent's own process: :class:`GuardedSession` wraps an
MCP ``ClientSession`` and runs every ``call_tool`` through the same saga logic as
``saga mcp-guard`` (:class:`~saga_store.gateway.Gateway`), without the extra
process hop. It runs on asyncio (anyio's default backend)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from saga_store.approval.policy import Policy
from saga_store.errors import InvalidInput
from saga_store.mcp.cancel import Cancellation
from saga_store.mcp.gateway import CallFn, Gateway, gateway_id
from saga_store.mcp.results import CallOutcome, client_error, client_result, result_text

if TYPE_CHECKING:
    from saga_store.client.api import SagaStore
    from saga_store.mcp.classify import Classification

# the SDK's progress callback: (progress, total, message)
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


def caller(session: Any, heard: Mapping[Any, ProgressFn] | None = None) -> CallFn:
    """How the gateway reaches a downstream MCP ``ClientSession``. A call whose
    ``_meta`` names a progress token of ``heard`` has the server's progress go to
    that token's callback (the SDK gives the server a token of its own)."""
    async def call(name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallOutcome:
        fn = (heard or {}).get(meta.get("progressToken"))
        if fn is not None:
            meta = {k: v for k, v in meta.items() if k != "progressToken"}
        from mcp.shared.exceptions import MCPError
        try:
            r = await session.call_tool(name, args, meta=meta, progress_callback=fn)
        except MCPError as exc:  # the server refused the call: not in doubt
            return CallOutcome(False, None, f"{exc.message} (JSON-RPC error {exc.code})",
                               error=exc.error.model_dump(mode="json", exclude_none=True))
        return CallOutcome(not r.is_error, r.structured_content, result_text(r.content),
                           raw=r, content=[c.model_dump(mode="json", by_alias=True,
                                                        exclude_none=True) for c in r.content])
    return call


class GuardedSession:
    """The gateway in the agent's own process: wrap an MCP ``ClientSession`` and
    every ``call_tool`` goes through the same saga logic as ``saga mcp-guard``,
    without the extra process hop.

        async with ClientSession(r, w) as raw:
            await raw.initialize()
            async with GuardedSession(raw, store, policy=Policy.safe()) as s:
                await s.call_tool("create_record", {"name": "a"})
    """

    def __init__(self, session: Any, saga_store: SagaStore, *, policy: Policy | None = None,
                 tools_map: Mapping[str, Classification] | None = None,
                 downstream: str = "in-process", agent_id: str = "mcp-client") -> None:
        self.session = session
        self._heard: dict[Any, ProgressFn] = {}  # progress token -> the caller's callback
        self._tokens = itertools.count(1)
        self.gateway = Gateway(saga_store, policy or Policy.safe(), tools_map or {},
                               caller(session, self._heard),
                               gateway_id(None, downstream), agent_id=agent_id,
                               dedupe_ttl_s=saga_store.settings.dedupe_ttl_s)
        self.gateway.to_client = self._notified
        self._settling: set[asyncio.Future[CallOutcome]] = set()  # calls the caller gave up

    async def __aenter__(self) -> GuardedSession:
        await self.list_tools()
        self._keeper = asyncio.get_running_loop().create_task(self.gateway.keep_alive())
        try:
            await self.gateway.recover()
        except BaseException:
            self._keeper.cancel()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._settling:  # cancelled calls finish settling before the saga closes
            await asyncio.gather(*self._settling, return_exceptions=True)
        self._keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._keeper
        try:
            self.gateway.commit()
        except InvalidInput:
            await self.gateway.abort("the session ended with a call unsettled")
        finally:
            self.gateway.leases.release()

    async def list_tools(self) -> Any:
        listed = await self.session.list_tools()
        return listed.model_copy(update={"tools": self.gateway.listed(listed.tools)})

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None,
                        meta: Mapping[str, Any] | None = None,
                        progress_callback: ProgressFn | None = None) -> Any:
        """As ``ClientSession.call_tool``: with ``progress_callback``, it hears the
        server's progress and, while the call waits for approval, the gateway's."""
        if progress_callback is None:
            return as_result(await self._handle(name, dict(arguments or {}), meta))
        token = f"saga-guarded-{next(self._tokens)}"
        self._heard[token] = progress_callback
        try:
            out = await self._handle(name, dict(arguments or {}),
                                     {**(meta or {}), "progressToken": token})
        finally:
            del self._heard[token]
        return as_result(out)

    async def _handle(self, name: str, args: dict[str, Any],
                      meta: Mapping[str, Any] | None) -> CallOutcome:
        """The gateway's handling of one call. A caller that cancels its ``call_tool``
        cancels the call as an MCP client does: the gateway goes on to settle it
        (an approval withdrawn, a running call cancelled downstream and in doubt)."""
        cancel = Cancellation()
        handling = asyncio.ensure_future(self.gateway.handle(name, args, meta, cancel=cancel))
        try:
            return await asyncio.shield(handling)
        except asyncio.CancelledError:
            cancel.cancel()
            self._settling.add(handling)
            handling.add_done_callback(self._settling.discard)
            raise

    async def _notified(self, msg: dict[str, Any]) -> None:
        """The gateway's notifications to its client: progress goes to its callback."""
        params = msg.get("params") or {}
        fn = self._heard.get(params.get("progressToken"))
        if msg.get("method") == "notifications/progress" and fn is not None:
            await fn(params.get("progress", 0), params.get("total"), params.get("message"))


def as_result(out: CallOutcome) -> Any:
    """A ``CallToolResult`` for the client: the server's own whenever it answered
    (with the rollback's note added if the gateway rolled back after it); the
    server's JSON-RPC error is raised as the SDK raises it."""
    import mcp_types as types
    if out.error is not None:
        from mcp.shared.exceptions import MCPError
        err = client_error(out)
        raise MCPError(err.get("code", -32603), str(err.get("message", "")), err.get("data"))
    if out.raw is not None and out.note is None and not isinstance(out.raw, dict):
        return out.raw  # the SDK's own model of the server's answer
    raw = out.raw.model_dump(mode="json", by_alias=True, exclude_none=True) \
        if out.raw is not None and not isinstance(out.raw, dict) else out.raw
    return types.CallToolResult.model_validate(client_result(
        dataclasses.replace(out, raw=raw)))
