"""Notifications to a person: a JSON POST to ``SAGA_NOTIFY_URL`` when a step
waits for approval and when a saga ends needing attention.

The payload is Slack-compatible (``text``) and carries structured fields:
``event``, ``saga_id``, ``step``, ``tool``, ``agent_id``, ``reason`` and, when
``SAGA_CONSOLE_URL`` is set, ``console_url`` (the saga's page). It never
carries arguments or results, so no secret can reach it.

Sending never blocks whoever notifies (a worker recording an approval
request, a compensator closing a saga): :func:`approval_requested` and
:func:`needs_attention` put the payload on a bounded queue and return; one
background thread per process posts it, retrying with exponential backoff.
When the queue is full (the receiver has been down for a long while) a
notification is dropped and logged, rather than holding a worker. Delivery is
best effort: a process killed with notifications still queued loses them; the
log and ``saga approvals`` / ``saga attention`` remain the truth.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import orjson

log = logging.getLogger("saga_store.notify")

QUEUE_SIZE = 1000
MAX_TEXT = 500  # a reason or a list of steps is cut to this many characters


class Notifier:
    """Posts JSON payloads to one URL from a background thread.

    >>> n = Notifier("http://127.0.0.1:9/hook")   # doctest: +SKIP
    >>> n.send({"text": "hello"})                  # doctest: +SKIP
    True
    """

    def __init__(self, url: str, *, attempts: int = 6, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, timeout_s: float = 5.0,
                 queue_size: int = QUEUE_SIZE) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError("SAGA_NOTIFY_URL must be an http:// or https:// URL")
        self.url = url
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.timeout_s = timeout_s
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(queue_size)
        self._thread = threading.Thread(target=self._run, name="saga-notify", daemon=True)
        self._thread.start()

    def send(self, payload: dict[str, Any]) -> bool:
        """Queue ``payload``; False if the queue is full and it was dropped."""
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.dropped += 1
            log.warning("notification dropped (queue full; is %s answering?): %s",
                        _safe_url(self.url), payload.get("event"))
            return False
        return True

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued was posted or given up; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        while True:
            payload = self._queue.get()
            try:
                if payload is None:
                    return
                self._deliver(payload)
            finally:
                self._queue.task_done()

    def _deliver(self, payload: dict[str, Any]) -> None:
        body = orjson.dumps(payload)
        for attempt in range(self.attempts):
            retry = self._post(body)
            if retry is None:
                self.sent += 1
                return
            if not retry or attempt == self.attempts - 1:
                break
            # equal jitter: half the delay fixed, half random, so many processes that
            # saw the same outage do not all come back in the same instant
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
            time.sleep(delay / 2 + random.uniform(0, delay / 2))
        self.failed += 1
        log.warning("notification %s for saga %s not delivered to %s", payload.get("event"),
                    payload.get("saga_id"), _safe_url(self.url))

    def _post(self, body: bytes) -> bool | None:
        """None when delivered; else whether trying again may help."""
        # S310: an http(s) URL the operator configured
        req = urllib.request.Request(self.url, data=body, method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json"})
        try:
            # S310: an http(s) URL the operator configured
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                resp.read()
            return None
        except urllib.error.HTTPError as exc:
            # a 4xx other than 408/429 means the receiver refuses this payload for good
            return exc.code >= 500 or exc.code in (408, 429)
        except (OSError, ValueError):  # refused, reset, timed out, bad address
            return True


def _safe_url(url: str) -> str:
    """The URL without its path and query (a webhook's path is often its secret)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}/…"


_lock = threading.Lock()
_current: tuple[int, str, Notifier] | None = None


def notifier() -> Notifier | None:
    """This process's notifier for ``SAGA_NOTIFY_URL``, or None when it is unset.
    A forked child gets its own (the parent's thread does not survive a fork)."""
    global _current
    url = os.environ.get("SAGA_NOTIFY_URL", "").strip()
    if not url:
        return None
    with _lock:
        if _current is None or _current[0] != os.getpid() or _current[1] != url:
            n = Notifier(url)
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
