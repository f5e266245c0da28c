"""A downstream call's answer as the gateway holds it (:class:`CallOutcome`), and
what goes back to the client from it: the server's own result or JSON-RPC
error, unchanged but for the note of a rollback (:func:`client_result`,
:func:`client_error`), a replay from the log (:func:`replayed`), or a
result the gateway words itself (:func:`built_result`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from saga_store.protocol.outcome import Outcome
from saga_store.tools.secrets import scrub

CONTENT_LOG_LIMIT = 64 * 1024  # bytes of a result's content blocks the log keeps
META_REPLAYED = "dev.chronomcp/replayed"  # in a result answered from the log
META_ROLLBACK = "dev.saga-store/rollback"  # in a result after which the gateway rolled back


@dataclass(frozen=True)
class CallOutcome:
    """What the downstream answered: ``ok`` (not isError), the structured content,
    the text content, and the raw result object to pass back to the client."""

    ok: bool
    structured: Any
    text: str
    raw: Any = None
    in_doubt: str | None = None  # the call raised: transport error, timeout
    content: list[Any] | None = None  # every block of the result, as on the wire
    task_id: str | None = None  # the server made the call an MCP task: its result comes later
    error: dict[str, Any] | None = None  # the server's JSON-RPC error, as it sent it
    note: str | None = None  # what the gateway rolled back after this call, if anything

    def logged(self) -> dict[str, Any]:
        """The result as the log keeps it: a repeat of the call is answered with it.
        Its content blocks, every one, unless they are too large to log."""
        out: dict[str, Any] = {"text": self.text[:2000]}
        if self.structured is not None:
            out["structuredContent"] = self.structured
        if self.content is not None:
            size = len(orjson.dumps(self.content))
            if size <= CONTENT_LOG_LIMIT:
                out["content"] = self.content
            else:
                out["content_omitted"] = size
        return out


def as_outcome(out: CallOutcome) -> Outcome:
    """A downstream answer in the protocol's terms."""
    if out.in_doubt:
        return Outcome.in_doubt(out.in_doubt)
    if out.ok:
        return Outcome.succeeded(out.logged())
    return Outcome.failed(out.text[:2000])


def scrubbed(out: CallOutcome, secrets: Mapping[str, Any]) -> CallOutcome:
    """The outcome as it may be logged: secret values blanked out of its text and
    structured content (servers echo arguments in errors). The client still gets
    the server's own answer (``raw``)."""
    if not secrets:
        return out
    def clean(x: Any) -> Any:
        return None if x is None else orjson.loads(scrub(orjson.dumps(x).decode(), secrets))
    return CallOutcome(out.ok, clean(out.structured), scrub(out.text, secrets), out.raw,
                       scrub(out.in_doubt, secrets) if out.in_doubt else None,
                       clean(out.content))


def result_text(content: Any) -> str:
    """The text parts of a tool result's content, as SDK models or as wire dicts."""
    if not isinstance(content, list):
        return ""
    parts = (c if isinstance(c, dict) else {"type": getattr(c, "type", None),
                                            "text": getattr(c, "text", None)}
             for c in content)
    return "\n".join(c.get("text") or "" for c in parts if c.get("type") == "text")


def replayed(ok: bool, result: Any, error: str | None) -> CallOutcome:
    """A repeated call's answer, from what the log recorded of the first: a success as
    the server gave it, every content block (marked in ``_meta`` as a replay); a
    failure as the error it was."""
    result = result if isinstance(result, dict) else {}
    text = str(result.get("text", error or ""))
    if not ok:
        return CallOutcome(False, result.get("structuredContent"),
                           f"(repeated call, recorded answer) {text}")
    content = result.get("content")
    raw: dict[str, Any] = {
        "content": content if isinstance(content, list) else [{"type": "text", "text": text}],
        "isError": False, "_meta": {META_REPLAYED: True}}
    if result.get("structuredContent") is not None:
        raw["structuredContent"] = result["structuredContent"]
    return CallOutcome(True, result.get("structuredContent"), text, raw=raw)


def built_result(out: CallOutcome) -> dict[str, Any]:
    """A tool result, on the wire, made from the outcome: for a failure or refusal
    (saying what happened and what was rolled back) and for the session tools."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": out.text}],
                              "isError": not out.ok}
    if out.structured is not None:
        result["structuredContent"] = out.structured
    return result


def client_result(out: CallOutcome) -> Any:
    """The client's result: the server's own, whole, whenever the server answered;
    if the gateway rolled the session back after it, the note that says what was
    undone is added as a last text block and under ``_meta``, the rest unchanged."""
    if not isinstance(out.raw, dict):
        return built_result(out)
    if out.note is None:
        return out.raw
    content = out.raw.get("content")
    meta = out.raw.get("_meta")
    return {**out.raw,
            "content": [*(content if isinstance(content, list) else []),
                        {"type": "text", "text": out.note}],
            "_meta": {**(meta if isinstance(meta, dict) else {}), META_ROLLBACK: out.note}}


def client_error(out: CallOutcome) -> dict[str, Any]:
    """The server's JSON-RPC error as it sent it (code, message, data); a rollback
    after it is said at the end of its message."""
    assert out.error is not None
    if out.note is None:
        return out.error
    return {**out.error, "message": f"{out.error.get('message', '')}\n\n{out.note}"}
