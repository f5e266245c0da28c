"""The console's security model: loopback by default, a token or a proxy's user
header for anything else, CSRF on every POST, nothing secret or unescaped on
a page."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from saga_store.cli.main import cli

from saga_store import InvalidInput, SagaStore
from saga_store.console import ConsoleConfig
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
