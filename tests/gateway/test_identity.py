"""The default gateway id: gateways share one only when their servers reach the same data."""

from __future__ import annotations

from saga_store.mcp.identity import gateway_id

CMD = ["npx", "-y", "@modelcontextprotocol/server-memory"]


def test_the_id_covers_the_command_its_directory_and_environment() -> None:
    base = gateway_id(CMD, None, cwd="/srv/a", env={"MEMORY_FILE_PATH": "/data/a.jsonl"})
    assert base == gateway_id(CMD, None, cwd="/srv/a",
                              env={"MEMORY_FILE_PATH": "/data/a.jsonl", "SHLVL": "3"})
    assert base != gateway_id(CMD, None, cwd="/srv/a",
                              env={"MEMORY_FILE_PATH": "/data/b.jsonl"})
    assert base != gateway_id(CMD, None, cwd="/srv/b",
                              env={"MEMORY_FILE_PATH": "/data/a.jsonl"})
    assert base != gateway_id([*CMD, "--x"], None, cwd="/srv/a",
                              env={"MEMORY_FILE_PATH": "/data/a.jsonl"})


def test_a_url_or_a_given_name_is_the_whole_id() -> None:
    assert gateway_id(None, "https://h/mcp", env={"A": "1"}) == gateway_id(None, "https://h/mcp")
    assert gateway_id(CMD, None, "host-a", cwd="/x") == gateway_id(None, None, "host-a")
