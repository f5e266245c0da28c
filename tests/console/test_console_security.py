"""The console's security model: loopback by default, a token or a proxy's user
header for anything else, CSRF on every POST, nothing secret or unescaped on
a page."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import InvalidInput, SagaStore
from saga_store.approval import requests as approvals
from saga_store.approval.policy import Decision, Verdict
from saga_store.console import ConsoleConfig, create_app
from saga_store.console.config import split_host
from saga_store.log.events import EventKind as K
from saga_store.testing import assert_eventually, free_port

from ..console_helpers import console, csrf_of, post_form
from ..helpers import committed_saga

TOKEN = "alice:" + "a" * 24 + ",bob:" + "b" * 24
POSTS = ["/approvals/S1/0/approve", "/approvals/S1/0/deny", "/attention/S1/ack",
         "/verify/run", "/login", "/logout"]


def test_an_exposed_bind_needs_a_token_or_a_proxy_header() -> None:
    with pytest.raises(InvalidInput, match="no authentication"):
        # S104: a non-loopback bind, to see it refused
        ConsoleConfig.from_env("0.0.0.0", env={})  # noqa: S104
    # S104: a non-loopback bind, to see it refused
    assert ConsoleConfig.from_env("0.0.0.0", env={"SAGA_CONSOLE_TOKEN": TOKEN}).tokens  # noqa: S104
    assert ConsoleConfig.from_env("10.1.2.3", env={
        "SAGA_CONSOLE_USER_HEADER": "X-Forwarded-User"}).user_header == "X-Forwarded-User"
    assert ConsoleConfig.from_env("127.0.0.1", env={}).open_access
    assert ConsoleConfig.from_env("::1", env={}).loopback
    with pytest.raises(InvalidInput, match="at least 16"):
        ConsoleConfig.from_env(env={"SAGA_CONSOLE_TOKEN": "short"})
    # S104: a non-loopback bind, to see it refused
    res = CliRunner().invoke(cli, ["console", "--host", "0.0.0.0"],  # noqa: S104
                             env={"SAGA_CONSOLE_TOKEN": "", "SAGA_CONSOLE_USER_HEADER": "",
                                  "SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert res.exit_code == 2
    assert "SAGA_CONSOLE_TOKEN" in res.output


def test_tokens_name_the_operator_by_bearer_or_sign_in(saga_store: SagaStore) -> None:
    # S104: a non-loopback bind, to see it refused
    config = ConsoleConfig.from_env("0.0.0.0", env={"SAGA_CONSOLE_TOKEN": TOKEN})  # noqa: S104
    tc = console(saga_store, tokens=config.tokens)
    assert tc.get("/sagas", headers={"accept": "application/json"}).status_code == 401
    to_login = tc.get("/sagas", follow_redirects=False)
    assert (to_login.status_code, to_login.headers["location"]) == (303, "/login?next=/sagas")
    assert tc.get("/sagas", headers={"authorization": "Bearer " + "x" * 24}).status_code == 401
    bearer = tc.get("/sagas", headers={"authorization": "Bearer " + "b" * 24})
    assert bearer.status_code == 200
    assert '<b id="operator">bob</b>' in bearer.text
    wrong = post_form(tc, "/login", "/login", token="c" * 24, next="/approvals")
    assert wrong.status_code == 401
    ok = post_form(tc, "/login", "/login", token="a" * 24, next="/approvals")
    assert (ok.status_code, ok.headers["location"]) == (303, "/approvals")
    assert "httponly" in ok.headers["set-cookie"].lower()
    assert '<b id="operator">alice</b>' in tc.get("/approvals").text
    away = post_form(tc, "/login", "/login", token="a" * 24, next="//evil.example/x")
    assert away.headers["location"] == "/"
    post_form(tc, "/sagas", "/logout")
    assert tc.get("/sagas", follow_redirects=False).status_code == 303


def test_a_proxy_header_names_the_operator(saga_store: SagaStore) -> None:
    tc = console(saga_store, user_header="X-Forwarded-User")
    assert tc.get("/sagas").status_code == 401
    page = tc.get("/sagas", headers={"x-forwarded-user": "carol@example.com"})
    assert '<b id="operator">carol@example.com</b>' in page.text
    assert tc.get("/sagas", headers={"x-forwarded-user": "x" * 200}).status_code == 401


def test_every_post_needs_the_csrf_token_of_its_page(saga_store: SagaStore) -> None:
    tc = console(saga_store)
    page = tc.get("/verify")
    token = csrf_of(page.text)
    assert tc.cookies.get("saga_csrf") == token
    for path in POSTS:
        assert tc.post(path, data={}).status_code == 403, path
        assert tc.post(path, data={"csrf": token + "x"}).status_code == 403, path
        forged = "n0nce." + "0" * 40
        tc.cookies.set("saga_csrf", forged)
        assert tc.post(path, data={"csrf": forged}).status_code == 403, path
        tc.cookies.set("saga_csrf", token)
    other_origin = tc.post("/verify/run", data={"csrf": token},
                           headers={"origin": "http://evil.example"})
    assert other_origin.status_code == 403
    fine = tc.post("/verify/run", data={"csrf": token}, follow_redirects=False)
    assert fine.status_code == 303


def test_pages_escape_what_agents_wrote_and_mask_secrets(saga_store: SagaStore) -> None:
    w = saga_store.events.open("agent-x")
    w.append(K.STEP_INTENT, step=0, tool="post_note", tool_call_id="c0", data={
        "args": {"note": "<script>alert('x')</script>", "api_token": "sk-live-0123456789",
                 "card_number": {"$secret": "sha256:abcd"}}, "reversibility": "compensable"})
    w.append(K.STEP_STARTED, step=0, attempt=1)
    w.append(K.STEP_SUCCEEDED, step=0, data={"result": {"echo": "<img src=x onerror=1>",
                                                         "password": "hunter2-secret"}})
    tc = console(saga_store)
    page = tc.get(f"/sagas/{w.saga_id}")
    assert page.status_code == 200
    html = page.text
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;" in html
    assert "sk-live-0123456789" not in html
    assert "hunter2-secret" not in html
    assert "sha256:abcd" not in html
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    committed_saga(saga_store.events, 1)
    echoed = tc.get("/sagas?agent=%3Cb%3Ex").text  # the filter form shows it again
    assert 'value="&lt;b&gt;x"' in echoed
    assert "<b>x" not in echoed
    assert tc.get("/sagas?agent=%22x").status_code == 400  # not an id at all
    err = tc.get("/sagas?since=%3Cscript%3E")
    assert err.status_code == 400
    assert "<script>" not in err.text


def test_saga_console_serves_until_stopped(redis_url: str) -> None:
    """The command itself: uvicorn on the given port, the token asked for."""
    port = free_port()
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-m", "saga_store.cli.main", "--redis-url", redis_url, "console", "--port",
         str(port)], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root, "SAGA_CONSOLE_TOKEN": "ops:" + "t" * 20})
    try:
        def get(path: str, token: str | None = None) -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                # S310: an http(s) URL the operator configured
                with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert_eventually(lambda: get("/healthz") == 200, timeout=30,
                          what="saga console to answer", swallow=(OSError,))
        assert get("/sagas") == 401
        assert get("/sagas", "t" * 20) == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert b"saga console on http://127.0.0.1:" in err


def _waiting_for_approval(saga_store: SagaStore) -> str:
    """A saga whose step 0 waits for a person, with no worker needed."""
    w = saga_store.events.open("agent-r")
    w.append(K.STEP_INTENT, step=0, tool="send_email", tool_call_id="c0",
             data={"args": {"to": "ceo@example.com"}, "reversibility": "irreversible"})
    verdict = Verdict(Decision.REQUIRE_APPROVAL, "irreversible", production=False)
    approvals.request(w, 0, "send_email", approvals.preview(
        "send_email", {"to": "ceo@example.com"}, "irreversible", None, verdict, 0), 0)
    return w.saga_id


@contextmanager
def _serving(config: ConsoleConfig, saga_store: SagaStore) -> Iterator[int]:
    """The console under uvicorn on ``config.port``, in a thread, for the block."""
    server = uvicorn.Server(uvicorn.Config(create_app(saga_store, config), host="127.0.0.1",
                                           port=config.port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert_eventually(lambda: server.started, timeout=20, what="the console to listen")
    try:
        yield config.port
    finally:
        server.should_exit = True
        thread.join(15)


def _http(port: int, method: str, path: str, headers: dict[str, str],
          body: str = "") -> http.client.HTTPResponse:
    """One request sent as a browser would, with the Host header it was given."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in {**headers, "content-length": str(len(body))}.items():
        conn.putheader(name, value)
    if body:
        conn.putheader("content-type", "application/x-www-form-urlencoded")
    conn.endheaders(body.encode() or None)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def _token(resp: http.client.HTTPResponse) -> str:
    found = re.search(r"saga_csrf=([^;]+)", resp.getheader("set-cookie") or "")
    assert found, "no CSRF cookie handed out"
    return found.group(1)


def test_a_dns_rebinding_page_cannot_decide_an_approval(saga_store: SagaStore) -> None:
    """A page of rebind.evil whose name resolves to 127.0.0.1 asks a loopback
    console for its inbox and posts an approval: 400, no cookie or token handed
    out, nothing appended. The same requests by a name the console serves work."""
    sid = _waiting_for_approval(saga_store)
    config = ConsoleConfig(port=free_port(), operator="olivia")
    log_len = len(saga_store.events.log.bodies(sid))
    with _serving(config, saga_store) as port:
        evil = {"host": f"rebind.evil:{port}", "accept": "text/html"}
        inbox = _http(port, "GET", "/approvals", evil)
        assert inbox.status == 400
        assert inbox.getheader("set-cookie") is None
        # even holding a token of the console's own (it never hands one to that name)
        mine = _http(port, "GET", "/approvals", {"host": f"127.0.0.1:{port}"})
        assert mine.status == 200
        token = _token(mine)
        form = f"csrf={token}"
        approve = f"/approvals/{sid}/0/approve"
        cookie = {"cookie": f"saga_csrf={token}"}
        rebound = _http(port, "POST", approve, {**evil, **cookie,
                                               "origin": f"http://rebind.evil:{port}"}, form)
        assert rebound.status == 400
        # a forged Origin with our Host: compared with the names served, not with Host
        foreign = _http(port, "POST", approve, {"host": f"127.0.0.1:{port}", **cookie,
                                               "origin": f"http://rebind.evil:{port}"}, form)
        assert foreign.status == 403
        assert _http(port, "GET", "/sagas", {"host": "127.0.0.1.evil"}).status == 400
        assert _http(port, "GET", "/healthz", evil).status == 200  # probes: "ok", no cookie
        assert len(saga_store.events.log.bodies(sid)) == log_len
        for host in (f"localhost:{port}", "localhost", f"[::1]:{port}", "LOCALHOST.:8000"):
            assert _http(port, "GET", "/approvals", {"host": host}).status == 200, host
        ok = _http(port, "POST", approve, {"host": f"localhost:{port}", **cookie,
                                          "origin": f"http://localhost:{port}"}, form)
        assert ok.status == 303
    kinds = [e["kind"] for e in saga_store.events.log.bodies(sid)]
    assert kinds.count(K.APPROVAL_GRANTED) == 1


def test_names_a_console_serves(saga_store: SagaStore) -> None:
    """Loopback names on any port, the bind address on its port, and each
    --allowed-host (SAGA_CONSOLE_ALLOWED_HOSTS) as given; a URL is refused."""
    plain = ConsoleConfig(port=8765)
    assert [plain.serves(h) for h in ("localhost:1", "127.0.0.1", "[::1]:8765", None, "",
                                       "evil.example", "127.0.0.2", "localhost:0",
                                       "localhost:x", "[::1]x", "a@localhost")] == \
        [True] * 3 + [False] * 8
    assert split_host("Console.Example.COM.:443") == ("console.example.com", 443)
    # S104: a bind on every interface serves no address name by itself
    anywhere = ConsoleConfig.from_env("0.0.0.0", 9000, env={  # noqa: S104
        "SAGA_CONSOLE_TOKEN": TOKEN,
        "SAGA_CONSOLE_ALLOWED_HOSTS": "ops.example.com:443, b.example"},
        allowed_hosts=("console.example.com",))
    assert [anywhere.serves(h) for h in ("console.example.com", "console.example.com:9000",
                                          "ops.example.com:443", "ops.example.com",
                                          "b.example:1", "0.0.0.0:9000", "10.0.0.5:9000")] \
        == [True, True, True, False, True, False, False]
    bound = ConsoleConfig(host="10.1.2.3", port=9000, tokens={"t" * 16: "ops"})
    assert (bound.serves("10.1.2.3:9000"), bound.serves("10.1.2.3:80")) == (True, False)
    six = ConsoleConfig(host="fd00::5", port=9000, tokens={"t" * 16: "ops"})
    assert six.serves("[fd00::5]:9000")
    with pytest.raises(InvalidInput, match="not a URL"):
        ConsoleConfig.from_env(env={}, allowed_hosts=("https://console.example.com/",))
    res = CliRunner().invoke(cli, ["console", "--allowed-host", "http://x/"],
                             env={"SAGA_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert res.exit_code == 2
    assert "not a URL" in res.output
    tc = console(saga_store, allowed_hosts=("console.example.com",))
    assert tc.get("http://console.example.com/sagas").status_code == 200
    refused = tc.get("http://elsewhere.example/sagas")
    assert refused.status_code == 400
    assert "--allowed-host" in refused.text
    assert "set-cookie" not in refused.headers
