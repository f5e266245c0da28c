"""Notifications to a person: a JSON POST to ``SAGA_NOTIFY_URL`` when a step
waits for approval and when a saga ends needing attention.

The payload is Slack-compatible (``text``) and carries structured fields:
``event``, ``saga_id``, ``step``, ``tool``, ``agent_id``, ``reason`` and, when
``SAGA_CONSOLE_URL`` is set, ``console_url`` (the saga's page). It never
carries arguments or results, so no secret can reach it.

Sending never blocks whoever notifies (a worker recording an approval
request, a compensator closing a saga): :func:`approval_requested` and
:func:`needs_attention` put the payload on a bounded queue and return; one
background thread per process posts it. A receiver cannot hold that thread:
each attempt has one deadline for all of it (connect, send, the response's
status and headers; the body is never read), after which its socket is shut
down (urllib's timeout is per socket read, so a receiver trickling bytes held
it for ever); redirects are never followed (one would send the payload to
wherever the receiver points); a failed attempt waits for its retry beside
the queue, not in front of it, so later notifications go out meanwhile. When
the queue is full (the receiver has been down a long while) the oldest
waiting notification is dropped, logged and counted
(``saga_notifications_dropped_total``), never the worker held. Delivery is
best effort: a process killed with notifications still queued loses them; the
log and ``saga approvals`` / ``saga attention`` remain the truth.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import http.client
import itertools
import logging
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

log = logging.getLogger("saga_store.notify")

QUEUE_SIZE = 1000
MAX_TEXT = 500  # a reason or a list of steps is cut to this many characters


@dataclass(order=True)
class _Waiting:
    """A notification not yet delivered: its place in arrival order, and when
    its next attempt is due (monotonic seconds)."""

    arrival: int
    payload: dict[str, Any] = field(compare=False)
    attempt: int = field(default=0, compare=False)
    due: float = field(default=0.0, compare=False)


class Notifier:
    """Posts JSON payloads to one URL from a background thread.

    >>> n = Notifier("http://127.0.0.1:9/hook")   # doctest: +SKIP
    >>> n.send({"text": "hello"})                  # doctest: +SKIP
    True
    """

    def __init__(self, url: str, *, attempts: int = 6, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, timeout_s: float = 5.0,
                 queue_size: int = QUEUE_SIZE,
                 on_drop: Callable[[], None] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("SAGA_NOTIFY_URL must be an http:// or https:// URL")
        self.url, self._parts = url, parts
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.timeout_s, self.queue_size, self.on_drop = timeout_s, queue_size, on_drop
        self.sent = self.failed = self.dropped = 0
        self._waiting: list[_Waiting] = []  # in arrival order; the thread takes the first due
        self._arrivals = itertools.count()
        self._busy = self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="saga-notify", daemon=True)
        self._thread.start()

    def send(self, payload: dict[str, Any]) -> bool:
        """Queue ``payload``; False if the queue was full and the oldest waiting
        notification was dropped to make room for it."""
        with self._cond:
            oldest = None
            if len(self._waiting) >= self.queue_size:
                oldest = self._waiting.pop(0)
                self.dropped += 1
            self._waiting.append(_Waiting(next(self._arrivals), payload))
            self._cond.notify_all()
        if oldest is not None:
            self._drop(oldest)
        return oldest is None

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued was posted or given up; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._waiting or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop the thread once its attempt in flight ends; what waits is left."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(self.timeout_s + 1)

    def _drop(self, item: _Waiting) -> None:
        if self.on_drop is not None:
            self.on_drop()
        log.warning("notification %s for saga %s dropped: the queue is full (%d waiting); is "
                    "%s answering?", item.payload.get("event"), item.payload.get("saga_id"),
                    self.queue_size, _safe_url(self.url))

    def _take(self) -> _Waiting | None:
        """The first notification due, waiting for one; None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                item = next((w for w in self._waiting if w.due <= now), None)
                if item is not None:
                    self._waiting.remove(item)
                    self._busy = True
                    return item
                later = min((w.due for w in self._waiting), default=None)
                self._cond.wait(None if later is None else later - now)
            return None

    def _run(self) -> None:
        while (item := self._take()) is not None:
            retry: bool | None = False
            try:
                retry = self._post(orjson.dumps(item.payload))
            except Exception:  # a payload that does not encode, say: never end the thread
                log.exception("notification %s could not be sent", item.payload.get("event"))
            with self._cond:
                self._busy = False
                self._settle(item, retry)
                self._cond.notify_all()

    def _settle(self, item: _Waiting, retry: bool | None) -> None:
        """Count a delivered notification, or put it back to wait for its next
        attempt, or give it up (under the lock)."""
        if retry is None:
            self.sent += 1
            return
        item.attempt += 1
        if retry and item.attempt < self.attempts:
            # equal jitter: half the delay fixed, half random, so many processes that
            # saw the same outage do not all come back in the same instant
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (item.attempt - 1))
            item.due = time.monotonic() + delay / 2 + random.uniform(0, delay / 2)
            bisect.insort(self._waiting, item)
            return
        self.failed += 1
        log.warning("notification %s for saga %s not delivered to %s", item.payload.get("event"),
                    item.payload.get("saga_id"), _safe_url(self.url))

    def _post(self, body: bytes) -> bool | None:
        """None when delivered; else whether trying again may help. One deadline
        covers the whole attempt: when it passes, the socket is shut down."""
        attempt = _Attempt(self._parts, self.timeout_s)
        target = self._parts.path or "/"
        if self._parts.query:
            target += "?" + self._parts.query
        try:
            attempt.conn.request("POST", target, body=body, headers={
                "Content-Type": "application/json", "Connection": "close"})
            status = attempt.conn.getresponse().status  # headers only: the body is never read
        except (OSError, http.client.HTTPException, ValueError):
            return True  # refused, reset, past its deadline, garbled, bad address
        finally:
            attempt.close()
        if attempt.expired:  # headers cut short by the deadline look complete
            return True
        if status < 300:
            return None
        if status < 400:
            log.warning("%s answered %d (a redirect), which is never followed: set "
                        "SAGA_NOTIFY_URL to the final address", _safe_url(self.url), status)
            return False
        # a 4xx other than 408/429 means the receiver refuses this payload for good
        return status >= 500 or status in (408, 429)


class _Attempt:
    """A connection to the URL's host that a timer ends at the deadline: it shuts
    down the socket (also mid-handshake, before http.client holds it), and any
    socket opened after that at once."""

    def __init__(self, parts: Any, timeout_s: float) -> None:
        if parts.scheme == "https":
            self.conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=timeout_s,
                context=ssl.create_default_context())
        else:
            self.conn = http.client.HTTPConnection(parts.hostname, parts.port,
                                                   timeout=timeout_s)
        self._opened: list[socket.socket] = []
        self._lock, self._over = threading.Lock(), threading.Event()
        self._create = self.conn._create_connection  # type: ignore[attr-defined]
        self.conn._create_connection = self._recorded  # type: ignore[attr-defined]
        self._timer = threading.Timer(timeout_s, self._cut)
        self._timer.daemon = True
        self._timer.start()

    @property
    def expired(self) -> bool:
        return self._over.is_set()

    def close(self) -> None:
        self._timer.cancel()
        self.conn.close()

    def _recorded(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock: socket.socket = self._create(*args, **kwargs)
        with self._lock:
            self._opened.append(sock)
        if self._over.is_set():
            _shut(sock)
        return sock

    def _cut(self) -> None:
        self._over.set()
        with self._lock:
            for sock in self._opened:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on it at once


def _safe_url(url: str) -> str:
    """The URL without its path and query (a webhook's path is often its secret)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}/…"


_lock = threading.Lock()
_current: tuple[int, str, Notifier] | None = None
_drop_counters: list[Callable[[], None]] = []


def count_drops(inc: Callable[[], None]) -> None:
    """Have this process's notifier call ``inc`` for each notification it drops
    (a worker passes its ``saga_notifications_dropped_total`` counter's ``inc``)."""
    with _lock:
        _drop_counters.append(inc)


def _dropped() -> None:
    for inc in list(_drop_counters):
        inc()


def notifier() -> Notifier | None:
    """This process's notifier for ``SAGA_NOTIFY_URL``, or None when it is unset.
    A forked child gets its own (the parent's thread does not survive a fork)."""
    global _current
    url = os.environ.get("SAGA_NOTIFY_URL", "").strip()
    if not url:
        return None
    with _lock:
        if _current is None or _current[0] != os.getpid() or _current[1] != url:
            n = Notifier(url, on_drop=_dropped)
            atexit.register(n.flush, 2.0)
            _current = (os.getpid(), url, n)
        return _current[2]


def payload(event: str, saga_id: str, *, step: int | None, tool: str | None,
            agent_id: str | None, reason: str) -> dict[str, Any]:
    """The JSON document posted: ``text`` for Slack, the rest for programs."""
    reason = reason[:MAX_TEXT]
    what = {"approval_requested": "waits for approval",
            "needs_attention": "ended needing a person"}.get(event, event)
    where = f" step {step} ({tool})" if step is not None else ""
    text = f"Saga {saga_id}{where} {what}: {reason}"
    out: dict[str, Any] = {"text": text, "event": event, "saga_id": saga_id, "step": step,
                           "tool": tool, "agent_id": agent_id, "reason": reason}
    base = os.environ.get("SAGA_CONSOLE_URL", "").strip().rstrip("/")
    if base:
        out["console_url"] = f"{base}/sagas/{saga_id}"
        out["text"] += f" <{out['console_url']}>"
    return out


def approval_requested(saga_id: str, step: int, tool: str, agent_id: str | None,
                       reason: str) -> None:
    """Tell a person that a step waits for approval (no-op without SAGA_NOTIFY_URL)."""
    _send("approval_requested", saga_id, step=step, tool=tool, agent_id=agent_id,
          reason=reason)


def needs_attention(saga_id: str, agent_id: str | None, attention: Sequence[str]) -> None:
    """Tell a person that a saga ended needing attention, with what could not be
    undone; no-op when ``attention`` is empty or SAGA_NOTIFY_URL is unset."""
    if attention:
        _send("needs_attention", saga_id, step=None, tool=None, agent_id=agent_id,
              reason="could not undo " + ", ".join(attention))


def _send(event: str, saga_id: str, **fields: Any) -> None:
    # a notification must never fail the work that raised it
    try:
        n = notifier()
        if n is not None:
            n.send(payload(event, saga_id, **fields))
    except Exception:
        log.exception("notification %s for saga %s could not be queued", event, saga_id)
