"""While a world is left, only TensorPipe's notice about a closing connection is dropped from
stderr; everything else written to file descriptor 2 then still gets through, in order (pytest's
capfd reads the descriptor, as a terminal would)."""

from __future__ import annotations

import os

import pytest

from bagpipe.core.roles.quiet import departure_notices_dropped

NOTICE = (b"[rank1]:[W1201 00:48:58.945 tensorpipe_agent.cpp:723] RPC agent for server_0 encountered "
          b"error when reading incoming request from driver: pipe closed (this error originated at "
          b"tensorpipe/core/pipe_impl.cc:356)\n")


def test_only_the_departure_notice_is_dropped(capfd: pytest.CaptureFixture[str]) -> None:
    with departure_notices_dropped():
        os.write(2, NOTICE)
        os.write(2, NOTICE.replace(b"pipe closed", b"eof"))
        os.write(2, b"a real error\n")
        os.write(2, NOTICE.replace(b"incoming request", b"incoming response"))
        os.write(2, b"no newline")
    os.write(2, b" after\n")
    err = capfd.readouterr().err
    assert err.splitlines() == ["a real error",
                                NOTICE.replace(b"incoming request", b"incoming response")
                                .decode().rstrip(), "no newline after"]
