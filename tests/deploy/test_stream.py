"""Stream.read_until: a marker anywhere (first line, cut between reads) and work linear in the output's size.

A rollback reads the whole history (up to 100,000 lines) through read_until; searching the whole buffer
again after every 32 KiB read made a 32 MiB history take 24 s. The count of searched bytes, not a clock,
says whether that came back.
"""
from __future__ import annotations

import pytest

from vgpu_patch.report.errors import DeployError
from vgpu_patch.transport.base import Stream


def stream(data: bytes, chunk: int) -> Stream:
    pos = 0

    def recv(n: int) -> bytes:
        nonlocal pos
        out = data[pos:pos + min(n, chunk)]
        pos += len(out)
        return out

    return Stream("node", recv=recv, send=lambda b: None, close_input=lambda: None, wait=lambda: (0, ""),
                  wrapped=False, command="probe")


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 15])
def test_markers_are_found_first_cut_and_in_order(chunk: int) -> None:
    s = stream(b"@@end-a\nline 1\nline 2\n@@end-b\ntail\n@@end-c\nrest", chunk)
    assert s.read_until("@@end-a") == "@@end-a\n"
    assert s.read_until("@@end-b") == "line 1\nline 2\n@@end-b\n"
    assert s.read_until("@@end-c") == "tail\n@@end-c\n"
    assert s.finish().stdout == "rest"


def test_a_marker_inside_a_longer_line_does_not_count() -> None:
    s = stream(b"x@@end\n@@endless\n@@end\n", 4)
    assert s.read_until("@@end") == "x@@end\n@@endless\n@@end\n"


def test_output_ending_before_the_marker_is_one_error() -> None:
    with pytest.raises(DeployError, match="ended early with exit 0"):
        stream(b"no marker here\n", 5).read_until("@@end")


@pytest.mark.parametrize("mib", [1, 4, 16])
def test_the_work_grows_with_the_size_not_its_square(mib: int) -> None:
    line = b'{"action": "reapply", "from_sha256": "' + b"a" * 64 + b'", "to_sha256": "' + b"b" * 64 + b'"}\n'
    body = line * ((mib << 20) // len(line))
    s = stream(body + b"@@end\n", 1 << 15)
    assert len(s.read_until("@@end")) == len(body) + 6
    assert s.scanned <= 2 * len(body), f"{s.scanned} bytes searched for {len(body)} of output"
