"""The table of exit codes in docs/reference.md is what the commands return: 0-3
here, the saga outcomes of 'saga run --wait' in test_run_exit_codes."""

from __future__ import annotations

import re
from pathlib import Path

import redis
from click.testing import CliRunner, Result
from saga_store.cli import common
from saga_store.cli.main import cli
from saga_store.cli.workers import RUN_EXIT

from saga_store.log.store import EventStore

from ..helpers import committed_saga, edit_body, tamper
from .test_run_exit_codes import RUN_CASES, TIMEOUT_CODE

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def documented() -> dict[int, str]:
    """The exit-code table of the reference's CLI section: code -> meaning."""
    text = REFERENCE.read_text()
    section = text[text.index("## CLI"):text.index("## Configuration")]
    table = section[section.index("| exit | meaning |"):]
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", table.split("\n\n")[0], re.M)
    return {int(code): meaning for code, meaning in rows}


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"SAGA_REDIS_URL": url, "SAGA_HMAC_KEY": "",
                                                    "SAGA_HMAC_KEY_FILE": ""})


def test_the_table_lists_each_code_once_and_the_code_defines_the_same() -> None:
    table = documented()
    assert sorted(table) == list(range(8))
    assert (common.EXIT_OK, common.EXIT_INTEGRITY, common.EXIT_USAGE,
            common.EXIT_UNAVAILABLE) == (0, 1, 2, 3)
    for status, code in RUN_EXIT.items():
        assert str(status) in table[code].replace(" ", "_") or code == 0, (status, code)
    tested = {0, 1, 2, 3} | {code for _, code, _ in RUN_CASES} | {TIMEOUT_CODE}
    assert tested == set(table)  # every documented code has a test that produces it


def test_codes_0_to_3_are_what_the_commands_return(store: EventStore, client: redis.Redis,
                                                    redis_url: str) -> None:
    table = documented()
    w = committed_saga(store)
    assert "success" in table[0]
    assert run(redis_url, "verify").exit_code == 0
    assert run(redis_url, "ls").exit_code == 0
    assert "usage error" in table[2]
    assert run(redis_url, "show", "no-such-saga").exit_code == 2
    assert run(redis_url, "ls", "--bogus").exit_code == 2
    assert "unreachable" in table[3]
    assert run("redis://127.0.0.1:1/0", "ls").exit_code == 3
    assert "integrity" in table[1]
    tamper(client, w.saga_id, lambda es: [*es[:3], edit_body(es[3], lambda b: b.update(ts=5)),
                                          *es[4:]])
    assert run(redis_url, "verify").exit_code == 1
