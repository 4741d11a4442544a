"""ui/nodelay.py: the dashboard's listening socket made so that asyncio sets TCP_NODELAY on every connection."""
from __future__ import annotations

import asyncio
import socket

import pytest

from ui import nodelay


def streamlit_like() -> socket.socket:
    """A listening socket as Streamlit 1.67 binds it: `socket.socket(family)` (protocol 0), non-blocking."""
    s = socket.socket(family=socket.AF_INET)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    s.set_inheritable(True)
    return s


def accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY of the connection asyncio accepts on `listener` (a client connecting once)."""
    seen: list[int] = []

    async def main() -> None:
        got = asyncio.Event()

        def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            got.set()

        server = await asyncio.start_server(handler, sock=listener)
        _, w = await asyncio.open_connection(*listener.getsockname()[:2])
        await asyncio.wait_for(got.wait(), 60)
        w.close()
        server.close()

    asyncio.run(main())
    return seen[0]


def test_streamlits_socket_leaves_nagle_on_and_the_wrapped_one_turns_it_off() -> None:
    assert accepted_nodelay(streamlit_like()) == 0  # the 40 ms per kept-alive request
    plain = streamlit_like()
    fd, name = plain.fileno(), plain.getsockname()
    s = nodelay.tcp_socket(plain)
    assert s.fileno() == fd and s.getsockname() == name and s.proto == socket.IPPROTO_TCP
    assert not s.getblocking() and s.get_inheritable()
    assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert accepted_nodelay(s) != 0


def test_other_sockets_are_left_alone() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        assert nodelay.tcp_socket(u) is u


def test_install_wraps_streamlits_binding_and_off_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.web.server.starlette import starlette_server

    original = getattr(starlette_server, "_bind_socket")
    monkeypatch.setattr(starlette_server, "_bind_socket", original)  # restored after the test
    monkeypatch.setenv("HEADLENS_UI_NODELAY", "off")
    assert nodelay.install() is False and getattr(starlette_server, "_bind_socket") is original
    monkeypatch.delenv("HEADLENS_UI_NODELAY")
    assert nodelay.install() is True
    s = getattr(starlette_server, "_bind_socket")("127.0.0.1", 0, 8)
    try:
        assert s.proto == socket.IPPROTO_TCP and s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        s.close()
