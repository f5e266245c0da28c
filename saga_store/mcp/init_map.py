"""A starter tools-map, written from what a downstream server says of its tools
(``saga mcp-guard --init-tools-map FILE``).

The server is started (or reached) as the gateway would, asked to initialize and
for every page of tools/list, and each tool becomes an entry in the form
:func:`saga_store.mcp.classify.load_tools_map` reads, from the first that says
something:

1. the server's ``_meta["dev.chronomcp/compensate"]`` declaration (reversibility,
   compensation tool and mapping, ``timeoutMs`` as ``timeout_s``, ``maxRetries``
   + 1 as ``attempts``); what the tools-map form has no place for
   (``sideEffectScope``, ``notes``) is written as a comment, since an entry
   replaces the declaration;
2. the MCP annotations: ``readOnlyHint`` gives ``readonly``, ``destructiveHint``
   ``irreversible``, each with a comment to check it (a local entry is trusted by
   the policy as the server's hint is not);
3. otherwise a commented-out entry for a person to decide, with a guessed
   compensation (``create_x`` undone by ``delete_x``...) if one fits.

Every compensation is checked against the compensation tool's schema
(:mod:`saga_store.mcp.mapcheck`); one that can never make a valid call is written
commented out, with the reason. The file is written atomically and an existing
one is kept unless ``force``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from saga_store.errors import InvalidInput
from saga_store.mcp.declared import DEFAULT_ATTEMPTS, META_COMPENSATE, Compensation, read_declared
from saga_store.mcp.mapcheck import mapping_problem

log = logging.getLogger("saga_store.gateway")
ANSWER_TIMEOUT_S = 60.0
STOP_S = 1.0
MAX_PAGES = 1000
UNDO_VERBS = {"create": ("delete", "remove"), "add": ("remove", "delete"),
              "insert": ("delete", "remove"), "set": ("clear", "unset", "delete"),
              "reserve": ("release", "cancel"), "book": ("cancel",),
              "charge": ("refund",), "take": ("refund",), "open": ("close",),
              "start": ("stop", "cancel"), "enable": ("disable",), "lock": ("unlock",),
              "attach": ("detach",), "assign": ("unassign",), "subscribe": ("unsubscribe",)}
SWAPS = (("source", "destination"), ("from", "to"), ("src", "dst"), ("old_path", "new_path"),
         ("oldPath", "newPath"))
SECRET_NAME = re.compile(r"(?i)(password|passwd|secret|token|api_?key|credential)")
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# -- talking to the server ----------------------------------------------------

async def list_tools(command: Sequence[str], url: str | None,
                     timeout_s: float = ANSWER_TIMEOUT_S) -> tuple[dict[str, Any], list[Any]]:
    """The server's initialize result and every tool of its tools/list, as the SDK's
    ``Tool`` models."""
    import anyio
    import mcp_types as types
    from pydantic import ValidationError
    what = url or " ".join(command)
    async with _connected(command, url) as talk:
        try:
            with anyio.fail_after(timeout_s):
                info = await talk.request("initialize", {
                    "protocolVersion": types.LATEST_PROTOCOL_VERSION, "capabilities": {},
                    "clientInfo": {"name": "saga-mcp-guard-init", "version": "1"}})
                await talk.notify("notifications/initialized")
                raw: list[Any] = []
                cursor = None
                for _ in range(MAX_PAGES):
                    page = await talk.request("tools/list", {"cursor": cursor} if cursor else {})
                    raw.extend(page.get("tools") or [])
                    cursor = page.get("nextCursor")
                    if not cursor:
                        break
                else:
                    raise InvalidInput(f"the downstream server {what!r} gave more than "
                                       f"{MAX_PAGES} pages of tools/list")
        except TimeoutError:
            raise InvalidInput(f"the downstream server {what!r} did not answer within "
                               f"{timeout_s:g} s; check that it speaks MCP on stdio "
                               "(or at the URL)") from None
    tools = []
    for t in raw:
        try:
            tools.append(types.Tool.model_validate(t))
        except ValidationError as exc:  # known by its name only, as the gateway knows it
            name = t.get("name") if isinstance(t, dict) else None
            if not isinstance(name, str) or not name:
                log.warning("the server listed a tool without a name; left out")
                continue
            log.warning("tool %r does not read as an MCP tool (%d error(s)); written by "
                        "name only", name, exc.error_count())
            tools.append(types.Tool(name=name, input_schema={"type": "object"},
                                    description="(its listing does not read as an MCP tool)"))
    return info, tools


class _Talk:
    """JSON-RPC requests over a downstream (see :mod:`saga_store.mcp.downstream`)."""

    def __init__(self, down: Any, what: str) -> None:
        self.down, self.what, self._next = down, what, 0

    async def notify(self, method: str) -> None:
        await self._send({"jsonrpc": "2.0", "method": method})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        rid = f"saga-init-{self._next}"
        await self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            got = await self.down.receive()
            if got is None:
                raise InvalidInput(f"the downstream server {self.what!r} ended before it "
                                   f"answered {method}; see its stderr above")
            msg = got[0]
            if not isinstance(msg, dict):
                continue
            if msg.get("id") == rid and ("result" in msg or "error" in msg):
                if "error" in msg:
                    err = msg["error"] if isinstance(msg["error"], dict) else {}
                    raise InvalidInput(f"the downstream server {self.what!r} refused {method}: "
                                       f"{err.get('message', msg['error'])}")
                result = msg["result"]
                return result if isinstance(result, dict) else {}
            if msg.get("method") == "ping" and "id" in msg:
                await self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            elif "method" in msg and "id" in msg:  # the server asks something: nothing to give
                await self._send({"jsonrpc": "2.0", "id": msg["id"], "error": {
                    "code": -32601, "message": "not supported while listing tools"}})

    async def _send(self, msg: dict[str, Any]) -> None:
        try:
            await self.down.send(msg)
        except (ConnectionError, OSError):
            raise InvalidInput(f"the downstream server {self.what!r} closed its input; see "
                               "its stderr above") from None


class _HttpDown:
    """A Streamable HTTP downstream whose transport errors end the listing (the
    gateway's own logs them and waits on)."""

    def __init__(self, read: Any, write: Any, url: str) -> None:
        from saga_store.mcp.downstream import SdkDownstream
        self.sdk, self.url = SdkDownstream(read, write), url

    async def send(self, msg: dict[str, Any]) -> None:
        await self.sdk.send(msg)

    async def receive(self) -> tuple[Any, None] | None:
        import anyio
        try:
            item = await self.sdk.read.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        if isinstance(item, Exception):
            raise InvalidInput(f"cannot reach the downstream server at {self.url}: {item}")
        return item.message.model_dump(by_alias=True, mode="json", exclude_unset=True), None


@contextlib.asynccontextmanager
async def _connected(command: Sequence[str], url: str | None) -> AsyncIterator[_Talk]:
    from saga_store.mcp.downstream import PipeDownstream
    if url:
        from mcp.client.streamable_http import streamable_http_client
        try:
            async with streamable_http_client(url) as streams:
                yield _Talk(_HttpDown(streams[0], streams[1], url), url)
        except InvalidInput:
            raise
        except Exception as exc:  # the transport's task group: connection refused, ...
            raise InvalidInput(f"cannot reach the downstream server at {url}: "
                               f"{_first(exc)}") from None
        return
    down = await PipeDownstream.start(list(command))
    try:
        yield _Talk(down, " ".join(command))
    finally:
        await down.close(grace_s=STOP_S)  # it listed its tools: no long wait


def _first(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# -- the entries --------------------------------------------------------------

@dataclass
class Entry:
    """One tool's part of the file: its lines, and where it came from."""

    name: str
    source: str  # _meta, annotations, guess, undecided
    lines: list[str] = field(default_factory=list)
    active: bool = True  # an uncommented entry


def entries(tools: Sequence[Any]) -> list[Entry]:
    by_name = {t.name: t for t in tools}
    undoes: dict[str, list[str]] = {}
    for t in tools:
        comp = _declared_compensation(t)
        if comp is not None:
            undoes.setdefault(comp.tool, []).append(t.name)
    return [_entry(t, by_name, undoes.get(t.name, [])) for t in tools]


def _declared_compensation(tool: Any) -> Compensation | None:
    meta = tool.meta if isinstance(tool.meta, dict) else {}
    try:
        return read_declared(meta[META_COMPENSATE], tool.name).compensation \
            if META_COMPENSATE in meta else None
    except InvalidInput:
        return None


def _entry(tool: Any, tools: Mapping[str, Any], undoes: list[str]) -> Entry:
    head = f"[tools.{_key(tool.name)}]"
    notes = _about(tool)
    if undoes:
        notes.append(f"# the server declares it the undo of {', '.join(undoes)}")
    meta = tool.meta if isinstance(tool.meta, dict) else {}
    if META_COMPENSATE in meta:
        try:
            d = read_declared(meta[META_COMPENSATE], tool.name)
        except InvalidInput as exc:
            notes.append(f"# CHECK: the server's {META_COMPENSATE} declaration does not read "
                         f"({_one_line(str(exc))}); classified from its annotations instead")
        else:
            return _declared(tool, tools, head, notes, d)
    ann = tool.annotations
    secret = _secret_line(tool)
    if ann is not None and ann.read_only_hint:
        return Entry(tool.name, "annotations", [*notes, head, 'reversibility = "readonly"   '
                     "# the server's readOnlyHint; CHECK it changes nothing: here it is "
                     "your word, which the policy trusts", *secret])
    if ann is not None and ann.destructive_hint is True:
        undo = _guess(tool, tools)
        lines = [*notes, head, 'reversibility = "irreversible"   # the server\'s '
                 "destructiveHint; CHECK: if a tool undoes it, make it compensable"]
        if undo is not None:
            lines += _commented_compensation(tool, tools, undo, _why(tool, undo),
                                             " (in place of the line above)")
        return Entry(tool.name, "annotations", [*lines, *secret])
    undo = _guess(tool, tools)
    lines = [*notes, f"# {head}", '# reversibility = "?"   # DECIDE: readonly, compensable '
             "(name its undo tool) or irreversible; left out, it is unknown to the policy "
             "(mutating, not undoable)"]
    if undo is not None:
        lines += _commented_compensation(tool, tools, undo, _why(tool, undo))
    lines += secret
    return Entry(tool.name, "guess" if undo is not None else "undecided", lines)


def _declared(tool: Any, tools: Mapping[str, Any], head: str, notes: list[str],
              d: Any) -> Entry:
    lines = [*notes]
    if d.scope:
        lines.append(f"# the server says it touches: {', '.join(d.scope)}")
    if d.notes:
        lines.append(f"# the server's notes: {_one_line(d.notes)}")
    if d.scope or d.notes:
        lines.append("# (with an entry here, approvers no longer see what the server says it "
                     "touches or its notes; the tools-map form has no place for them)")
    comp: Compensation | None = d.compensation
    if comp is None:
        said = ("declared by the server; CHECK it changes nothing: here it is your word, "
                "which the policy trusts" if d.reversibility == "readonly"
                else "declared by the server")
        return Entry(tool.name, "_meta", [*lines, head, f"reversibility = "
                                          f"{_str(d.reversibility)}   # {said}",
                                          *_secret_line(tool)])
    problem = mapping_problem(tool, comp, tools)
    if problem is not None:
        lines += [f"# CHECK: the server declares it undone by {comp.tool}, but that mapping "
                  f"can never make a valid call ({_one_line(problem)}).",
                  "# Until it is fixed the gateway treats this tool as unclassified "
                  "(mutating, not undoable).", f"# {head}", '# reversibility = "compensable"',
                  f"# compensation = {_compensation(comp)}"]
        return Entry(tool.name, "undecided", [*lines, *_secret_line(tool)])
    entry = [head, 'reversibility = "compensable"   # declared by the server',
             f"compensation = {_compensation(comp)}", *_secret_line(tool)]
    return Entry(tool.name, "_meta", [*lines, *entry])


def _about(tool: Any) -> list[str]:
    out = []
    desc = _one_line(tool.description or "")
    if desc:
        out.append(f"# {tool.name}: {desc[:160]}{'...' if len(desc) > 160 else ''}")
    ann = tool.annotations
    if ann is not None:
        hints = [f"{k}={str(v).lower()}" for k, v in (
            ("readOnlyHint", ann.read_only_hint), ("destructiveHint", ann.destructive_hint),
            ("idempotentHint", ann.idempotent_hint), ("openWorldHint", ann.open_world_hint))
            if v is not None]
        if hints:
            out.append(f"# annotations: {', '.join(hints)}")
        if ann.idempotent_hint:
            out.append("# (idempotentHint: repeating it with the same arguments does nothing "
                       "more; it says nothing of undoing it)")
    return out


def _guess(tool: Any, tools: Mapping[str, Any]) -> Compensation | None:
    """An undo tool named as the opposite verb (create_x / delete_x), and a mapping
    by parameter names: the forward call's argument or output field of the same name."""
    name = tool.name
    swapped = _swap(tool)
    if swapped is not None:
        return swapped
    m = re.match(r"^([A-Za-z]+)([_-].*)$", name)
    if m is None:
        return None
    verb, rest = m.group(1), m.group(2)
    for undo in UNDO_VERBS.get(verb.lower(), ()):
        cand = (undo if verb.islower() else undo.capitalize()) + rest
        target = tools.get(cand)
        if target is None or cand == name:
            continue
        schema = target.input_schema if isinstance(target.input_schema, dict) else {}
        params = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        args = {}
        for p in required or list(params):
            path = _source_of(tool, p)
            if path is not None:
                args[p] = path
        return Compensation(cand, args)
    return None


def _swap(tool: Any) -> Compensation | None:
    """A move (``source``/``destination``, ``from``/``to``...) is undone by itself, the
    two swapped, when those are all it requires."""
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    required = set(schema.get("required") or [])
    for a, b in SWAPS:
        if required == {a, b}:
            return Compensation(tool.name, {a: f"$.input.{b}", b: f"$.input.{a}"})
    return None


def _source_of(tool: Any, param: str) -> str | None:
    ins = (tool.input_schema or {}).get("properties") or {}
    outs = ((tool.output_schema or {}).get("properties") or {}) if tool.output_schema else {}
    if param in outs:
        return f"$.output.structuredContent.{param}"
    if param in ins:
        return f"$.input.{param}"
    for short in ("id", param.rsplit("_", 1)[-1]):  # item_id from the output's id
        if param.endswith(("_id", "Id")) and short in outs:
            return f"$.output.structuredContent.{short}"
    return _projected(param, outs, ins)


def _projected(param: str, outs: Mapping[str, Any], ins: Mapping[str, Any]) -> str | None:
    """A list of names or ids (``entityNames``, ``item_ids``) from a list of objects
    that have one (``entities[*].name``): from the output first, which says what
    the call made (a name in the input may have been there before)."""
    m = re.match(r"^(.+?)_?(names|ids)$", param, re.IGNORECASE)
    if m is None:
        return None
    stem, field = m.group(1).lower(), "name" if m.group(2).lower() == "names" else "id"
    for props, prefix in ((outs, "$.output.structuredContent."), (ins, "$.input.")):
        for key, schema in props.items():
            items = schema.get("items") if isinstance(schema, dict) else None
            if _singular(key.lower()) == stem and isinstance(items, dict) \
                    and field in (items.get("properties") or {}):
                return f"{prefix}{key}[*].{field}"
    return None


def _singular(word: str) -> str:
    """entities -> entity, items -> item (enough for naming a list's elements)."""
    if word.endswith("ies"):
        return word[:-3] + "y"
    return word[:-1] if word.endswith("s") else word


def _why(tool: Any, undo: Compensation) -> str:
    return ("a guess: the same move, the other way" if undo.tool == tool.name
            else "a guess from the tool names")


def _commented_compensation(tool: Any, tools: Mapping[str, Any], comp: Compensation,
                            why: str, where: str = "") -> list[str]:
    problem = mapping_problem(tool, comp, tools)
    check = (f"CHECK: as mapped it can never make a valid call ({_one_line(problem)})"
             if problem else "CHECK that it really undoes the call")
    return [f"# perhaps undone by {comp.tool} ({why}); {check}{where}:",
            '# reversibility = "compensable"', f"# compensation = {_compensation(comp)}"]


def _secret_line(tool: Any) -> list[str]:
    props = (tool.input_schema or {}).get("properties") or {}
    names = [p for p, s in props.items() if SECRET_NAME.search(p)
             or (isinstance(s, dict) and s.get("format") == "password")]
    if not names:
        return []
    return [f"# secret = {_list(names)}   # CHECK: keep these arguments out of the log?"]


# -- TOML ---------------------------------------------------------------------

def _str(s: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, but for DEL)."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(k: str) -> str:
    return k if BARE_KEY.match(k) else _str(k)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_str(i) for i in items) + "]"


def _compensation(comp: Compensation) -> str:
    """A compensation in the tools-map's form, with its tries and their time limit
    where they are not the default (the server's ``maxRetries`` + 1, ``timeoutMs``)."""
    args = ", ".join(f"{_key(p)} = {_str(path)}" for p, path in comp.args.items())
    extra = "".join((f", timeout_s = {comp.timeout_s:g}" if comp.timeout_s is not None
                     else "",
                     f", attempts = {comp.max_attempts}" if comp.max_attempts != DEFAULT_ATTEMPTS
                     else ""))
    return f"{{ tool = {_str(comp.tool)}, args = {{ {args} }}{extra} }}" if args else \
        f"{{ tool = {_str(comp.tool)}, args = {{}}{extra} }}"


def _commented(line: str) -> str:
    return line if line.startswith("#") else f"# {line}"


def _one_line(s: str) -> str:
    return " ".join(s.split())


def render(tools: Sequence[Any], info: Mapping[str, Any], source: str,
           now: datetime | None = None) -> tuple[str, list[Entry]]:
    """The file's text, and its entries."""
    made = entries(tools)
    given = info.get("serverInfo")
    server: Mapping[str, Any] = given if isinstance(given, dict) else {}
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    counts = {s: sum(1 for e in made if e.source == s)
              for s in ("_meta", "annotations", "guess", "undecided")}
    kept = sum(1 for e in made if e.source == "_meta" and not e.active)
    head = [
        f"# Starter tools-map for {_one_line(str(server.get('name', '?')))} "
        f"{_one_line(str(server.get('version', '')))}".rstrip(),
        f"# written by saga mcp-guard --init-tools-map on {when}, from: {_one_line(source)}",
        f"# {len(made)} tools: {counts['_meta']} declared by the server"
        + (f" ({kept} left commented so the server's declaration applies)" if kept else "")
        + ", "
        f"{counts['annotations']} from its annotations, "
        f"{counts['guess'] + counts['undecided']} for a person to decide.",
        "#",
        "# Read every CHECK and DECIDE below. What this file says wins over anything the",
        "# server claims; a tool left out (or commented out) is unknown to the policy:",
        "# treated as mutating and not undoable. Use it with",
        "#   saga mcp-guard --tools-map THIS_FILE -- COMMAND ...",
        "# Listed as a client with no capabilities (sampling, roots, elicitation) sees them:",
        "# a server may offer more tools to a client that has some; add those by hand.",
        "",
    ]
    body: list[str] = []
    for e in made:
        body += [*e.lines, ""]
    return "\n".join(head + body).rstrip("\n") + "\n", made


def write_new(path: Path, text: str, force: bool) -> None:
    """``text`` into ``path`` atomically: a temporary file beside it, then a link (which
    fails if ``path`` exists) or, with ``force``, a rename over it."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidInput(f"cannot write {path}: no directory {directory}")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise InvalidInput(f"{path} exists; not overwritten (give --force to replace "
                                   "it)") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def refuse_existing(path: str | Path, force: bool) -> None:
    p = Path(path)
    if p.is_dir():
        raise InvalidInput(f"{p} is a directory; give a file to write the tools map to")
    if p.suffix.lower() in (".yaml", ".yml"):
        raise InvalidInput(f"{p}: the starter tools map is TOML; give a file name that "
                           "does not end in .yaml or .yml")
    if p.exists() and not force:
        raise InvalidInput(f"{p} exists; not overwritten (give --force to replace it)")


def init_tools_map(path: str | Path, command: Sequence[str], url: str | None,
                   force: bool = False) -> list[Entry]:
    """Write the starter tools-map for the server at ``command`` or ``url`` to ``path``;
    the entries written."""
    import anyio

    from saga_store.mcp.classify import load_tools_map
    refuse_existing(path, force)  # before the server is even started
    info, tools = anyio.run(list_tools, list(command), url)
    text, made = render(tools, info, url or " ".join(command))
    _check(text)
    write_new(Path(path), text, force)
    load_tools_map(path)  # what was written reads
    return made


def _check(text: str) -> None:
    """The text reads as a tools map, before it replaces anything."""
    from saga_store.mcp.classify import load_tools_map
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "tools.toml"
        p.write_text(text, encoding="utf-8")
        load_tools_map(p)
