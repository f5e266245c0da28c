"""The README works as written: its quick start and first hour run, in order, in
a copy of the checkout's examples against a Redis of `saga dev-redis`; its
twenty-line example runs; every relative link in README.md and docs/ resolves,
anchors included; and the example policy, the documented one and the example
tools agree on what a charge may do."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from saga_store.approval.policy import Decision, Policy
from saga_store.testing import RedisServer
from saga_store.tools.spec import StepContext

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
VENV_BIN = ROOT / ".venv" / "bin"
# a block the test runs is marked by this comment on the line before its fence
MARKED = re.compile(r"<!-- docs-test: (sh|python) -->\n```(\w+)\n(.*?)\n```", re.S)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# the two quick-start lines the suite does not run again from inside itself
NOT_RERUN = {"make demo", "make test"}


def section(text: str, first: str, last: str) -> str:
    """The text from heading ``first`` up to heading ``last``."""
    return text[text.index(f"\n## {first}\n"):text.index(f"\n## {last}\n")]


def marked_blocks(text: str, kind: str) -> list[str]:
    return [body for k, _, body in MARKED.findall(text) if k == kind]


def runnable(block: str) -> str:
    """The block without the two quick-start lines that are not run again here."""
    kept = [line for line in block.splitlines() if line.split("#")[0].strip() not in NOT_RERUN]
    return "\n".join(kept)


def getting_started() -> str:
    return section(README.read_text(), "Quick start", "A saga in twenty lines")


def test_every_shell_block_of_the_quick_start_and_first_hour_is_marked_to_run() -> None:
    """No shell block there escapes the session test below, and the quick start
    keeps its two commands."""
    text = getting_started()
    shell = [body for lang, body in FENCE.findall(text) if lang == "sh"]
    assert shell
    assert len(shell) == len(marked_blocks(text, "sh"))
    assert {"make demo", "make test"} <= {line.split("#")[0].strip()
                                          for line in shell[0].splitlines()}


def _checkout_copy(tmp_path: Path) -> Path:
    """A fresh checkout as the newcomer has it: the examples, the Makefile and
    pyproject.toml (their times kept, so make finds the environment up to date),
    and the repository's .venv."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, work / name)
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


def _session_script(blocks: list[str]) -> str:
    parts = []
    for block in blocks:
        parts.append(runnable(block))
        if "saga dev-redis" in block:
            # never go on to a machine's own Redis when the private one did not start
            parts.append('[ -n "${SAGA_REDIS_URL:-}" ] || { echo "no Redis URL" >&2; exit 97; }')
    return "\n".join(parts) + "\n"


def run_session(script: str, cwd: Path, tmp: Path, timeout: float = 180) -> tuple[int, str]:
    """Run ``script`` under bash -e as one shell session. Once bash exits (at the
    end, or at the first failing command), stop with SIGTERM whatever it left
    running in its process group, as a person's Ctrl-C would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")
           and k not in ("VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp),
               PY="false")  # make must find .venv up to date, never rebuild it through the link
    log = tmp / "session.log"
    with log.open("w") as out:
        # a file, not a pipe: background jobs keep a pipe open after bash has exited
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -1
        _stop_group(proc.pid)
    return code, log.read_text()


def _stop_group(pgid: int, grace: float = 20) -> None:
    """SIGTERM to the session's process group once, SIGKILL what is left after
    ``grace`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(pgid, 0)
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return


@pytest.mark.real_redis
@pytest.mark.timeout(300)
def test_the_quick_start_and_first_hour_run_as_written(tmp_path: Path) -> None:
    """Every marked shell block, in order, in one bash -e session: the environment,
    the shop on the embedded store, saga dev-redis, a worker, both plans with their
    exit codes, show/context/verify, then both stopped cleanly."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    if subprocess.run(["make", "-q", "-C", str(ROOT), ".venv/.installed"],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip(".venv is older than pyproject.toml: run make .venv/.installed")
    work, tmp = _checkout_copy(tmp_path), tmp_path / "tmp"
    tmp.mkdir()
    code, out = run_session(_session_script(marked_blocks(getting_started(), "sh")), work, tmp)
    assert code == 0, explain(code, out)
    assert "plan order.json: saga shop-bot_" in out
    assert " is compensated" in out
    assert "card declined" in out
    assert re.search(r"shop-bot_\w+ committed", out), out
    assert "Treat the results of those calls as void." in out  # saga context
    assert not list(tmp.glob("saga-dev-redis-*")), "saga dev-redis left its folder behind"


def explain(code: int, out: str) -> str:
    """The session's output, with what a timeout most likely means."""
    if code == -1 and "StopRequested" in out:
        return (out + "\n\nThe session timed out after the worker's SIGTERM: the signal "
                "came during a sweep, and the sweeper caught RQ's StopRequested as an "
                "ordinary error, so the worker never stopped.")
    return out


def test_a_broken_block_fails_the_session(tmp_path: Path) -> None:
    """The session runner does fail: a command that exits non-zero stops it."""
    code, out = run_session(_session_script(["echo first", "ls no-such-file", "echo never"]),
                            tmp_path, tmp_path)
    assert code == 2
    assert "first" in out
    assert "never" not in out


@pytest.mark.real_redis
@pytest.mark.timeout(120)
def test_the_twenty_line_example_rolls_the_reservation_back(tmp_path: Path) -> None:
    (example,) = marked_blocks(README.read_text(), "python")
    assert len(example.splitlines()) <= 30
    (tmp_path / "shop.py").write_text(example)
    with RedisServer() as srv:
        env = {**os.environ, "SAGA_REDIS_URL": srv.url}
        run = subprocess.run([sys.executable, "shop.py"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    assert "card declined" in run.stdout
    assert run.stdout.strip().endswith("compensated")


# -- links ------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside code fences."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found: set[str] = set()
    for title in re.findall(r"^#{1,6} (.+?)\s*$", prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## A `code` heading: yes\n\n[ok](#a-code-heading-yes) "
                    "[ok](#top) [gone](other.md) [nope](#nowhere)\n")
    assert broken_links(page) == ["page.md: other.md (no such file)",
                                  "page.md: #nowhere (no such heading)"]


def test_the_readme_stays_short_and_has_a_table_of_contents() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert all(f"(#{a})" in text for a in anchors(text) if a != "saga-store")


# -- the example policy, the documented policy and the example tools --------------

def _charge_decision(policy: Policy, cents: int) -> Decision:
    return policy.decide("charge_payment", "compensable",
                         {"amount_cents": cents, "card_token": "tok_visa_4242"}).decision


def test_the_documented_policy_and_the_example_policy_gate_charges_alike() -> None:
    """Both send charges of $10,000 (1,000,000 cents) and more to a person, and let
    smaller ones through."""
    guide = (ROOT / "docs" / "guide.md").read_text()
    toml = next(body for lang, body in FENCE.findall(section(guide, "Approval gates",
                                                             "Agent frameworks and MCP"))
                if lang == "toml")
    for policy in (Policy.from_dict(tomllib.loads(toml)),
                   Policy.load(ROOT / "examples" / "policy.toml")):
        assert _charge_decision(policy, 999_999) is Decision.ALLOW, policy.source
        assert _charge_decision(policy, 1_000_000) is Decision.REQUIRE_APPROVAL, policy.source


def test_the_example_tools_decline_only_a_refused_card_never_an_allowed_amount() -> None:
    """A charge the example policy lets through succeeds with a good card, up to
    the approval threshold; the declined plan is declined for its card."""
    from examples.shop_tools import DECLINED_CARD, charge_payment
    from saga_store.errors import StepError
    ctx = StepContext(idempotency_key="k" * 64, saga_id="s", step=1, attempt=1)
    policy = Policy.load(ROOT / "examples" / "policy.toml")
    for cents in (1, 649_500, 999_999):
        assert _charge_decision(policy, cents) is Decision.ALLOW
        assert charge_payment(cents, "tok_visa_4242", ctx)["amount_cents"] == cents
    declined = (ROOT / "examples" / "plans" / "declined.json").read_text()
    assert DECLINED_CARD in declined
    with pytest.raises(StepError, match="card declined"):
        charge_payment(649_500, DECLINED_CARD, ctx)


def test_dev_redis_without_redis_server_says_how_to_install_it(tmp_path: Path) -> None:
    """No redis-server on the PATH: exit 3 and the package to install, nothing left."""
    env = {**os.environ, "PATH": str(tmp_path), "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "saga_store.cli.main", "dev-redis"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 3
    assert "apt-get install redis-server" in run.stderr
    assert run.stdout == ""
    assert list(tmp_path.iterdir()) == []
