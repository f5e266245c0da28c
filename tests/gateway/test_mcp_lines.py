"""The gateway's pipes, line by line: messages split across reads or sharing one,
a last line without its newline, a line over the limit skipped with its
tail, and the client's lines acted on at once only when that keeps their order."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from saga_store.mcp import downstream as mcp_downstream
from saga_store.mcp.downstream import Lines, PipeDownstream
from saga_store.mcp.relay import ClientPipe


def test_lines_are_split_however_the_bytes_arrive() -> None:
    lines = Lines()
    assert lines.feed(b'{"a":') == []
    assert lines.feed(b'1}\n{"b":2}\n{"c"') == [b'{"a":1}\n', b'{"b":2}\n']
    assert lines.feed(b":3}") == []
    assert lines.end() == b'{"c":3}'  # the last line, without its newline
    assert lines.end() is None


def test_a_line_over_the_limit_is_skipped_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_downstream, "LINE_LIMIT", 8)
    lines = Lines()
    assert lines.feed(b"0123456789") == [None]  # over the limit: stands as None, once
    assert lines.feed(b"abcdefghij") == []  # still that line: dropped as it comes
    assert lines.feed(b'xyz\n{"ok":1}\n') == [b'{"ok":1}\n']
    assert lines.feed(b"012345678\n{}\n") == [None, b"{}\n"]  # over, in one piece
    assert lines.feed(b"01234567\n") == [b"01234567\n"]  # at the limit
    assert lines.feed(b"0123456789") == [None]
    assert lines.end() is None  # an unfinished line over the limit stays skipped


def test_the_client_pipe_acts_at_once_only_when_nothing_waits_before() -> None:
    async def go() -> tuple[list[bytes], list[bytes | None]]:
        pipe = ClientPipe()
        taken: list[bytes] = []

        def now(line: bytes) -> bool:
            if line.startswith(b"call"):
                taken.append(line)
                return True
            return False
        pipe.now = now
        read: list[bytes | None] = []
        lines = pipe.lines()

        def nxt() -> Any:  # a line out of order fails the test at once, not by a hang
            return asyncio.wait_for(anext(lines), 5)
        pipe.data_received(b"call 1\nlist\ncall 2\n")  # call 2 waits behind list
        read.append(await nxt())  # list: being acted on
        pipe.data_received(b"call 3\n")  # the reader is busy: in order, behind it
        read.append(await nxt())
        read.append(await nxt())  # call 3: being acted on, nothing queued
        pipe.data_received(b"call 5\n")  # still behind the reader's line
        read.append(await nxt())
        reader = asyncio.ensure_future(anext(lines))
        await asyncio.sleep(0)  # one turn: the reader is waiting again
        pipe.data_received(b"call 4\n")  # nothing before it: at once
        pipe.data_received(b"tail")
        assert pipe.eof_received() is False
        pipe.data_received(b"call 6\n")  # after the end (SIGTERM): not read
        read.append(await asyncio.wait_for(reader, 5))
        with pytest.raises(StopAsyncIteration):
            await anext(lines)  # the end comes at once
        return taken, read
    taken, read = asyncio.run(go())
    assert taken == [b"call 1\n", b"call 4\n"]
    assert read == [b"list\n", b"call 2\n", b"call 3\n", b"call 5\n", b"tail"]


def test_a_server_answer_is_handed_over_in_the_turn_it_is_read() -> None:
    script = ("import sys\n"
              "for line in sys.stdin:\n"
              "    sys.stdout.write('not json\\n' + line)\n"
              "    sys.stdout.flush()\n"
              "sys.stdout.write('{\"last\": true}')\n")

    async def go() -> tuple[list[object], list[object], int | None]:
        down = await PipeDownstream.start([sys.executable, "-c", script])
        taken: list[object] = []
        down.answers_at_once(lambda msg: bool(msg.get("own")) and not taken.append(msg))
        await down.send({"own": 1})
        await down.send({"other": 2})
        rest = [await down.receive()]
        await down.close()  # it writes its last line as its input ends
        rest += [await down.receive(), await down.receive()]
        return taken, rest, down.transport.get_returncode()
    taken, rest, code = asyncio.run(go())
    assert taken == [{"own": 1}]  # never queued for the reader
    assert rest == [({"other": 2}, b'{"other":2}\n'), ({"last": True}, b'{"last": true}\n'),
                    None]
    assert code == 0
