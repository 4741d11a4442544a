"""The dashboard's connections without Nagle's delay: 40 ms less per file a browser fetches on a kept-alive connection.

Streamlit 1.67 binds its listening socket itself (`starlette_server._bind_socket`: `socket.socket(family)`, protocol
number 0) and hands it to uvicorn. asyncio sets TCP_NODELAY on an accepted connection only when the socket's
protocol is IPPROTO_TCP, so Streamlit's connections keep Nagle's algorithm: a response written in two parts (headers,
then body) waits for the browser's delayed ACK, about 40 ms, on every request after a connection's first. A new
browser fetches some 130 JS/CSS files over its 6 connections, so that is 20-odd rounds of 40 ms (bench/RESULTS.md:
44 ms a request kept alive, against 0.3 ms for uvicorn binding its own socket, on this machine).

`install()` wraps Streamlit's `_bind_socket` so that the socket it returns says IPPROTO_TCP (the same file
descriptor, re-wrapped) and has TCP_NODELAY itself; asyncio then sets TCP_NODELAY on every connection. Where the
hook is missing it does nothing and says so. HEADLENS_UI_NODELAY=off leaves Streamlit's socket as it is (for
bench/bench_ui.py's before/after).
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable


def tcp_socket(sock: socket.socket) -> socket.socket:
    """`sock` (a TCP socket created with protocol 0) as a socket object with protocol IPPROTO_TCP and TCP_NODELAY:
    the same descriptor, its blocking mode and inheritability kept. Any other socket is returned as it is."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return sock
    if sock.proto != socket.IPPROTO_TCP:
        blocking, inheritable = sock.getblocking(), sock.get_inheritable()
        sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        sock.setblocking(blocking)
        sock.set_inheritable(inheritable)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def enabled() -> bool:
    return os.environ.get("HEADLENS_UI_NODELAY", "").strip().lower() not in ("off", "0", "no")


def install() -> bool:
    """Wrap Streamlit's socket binding (before the server starts); True when it did."""
    if not enabled():
        return False
    try:
        from streamlit.web.server.starlette import starlette_server
    except ImportError:
        return False
    original: Callable[..., socket.socket] | None = getattr(starlette_server, "_bind_socket", None)
    if original is None:
        print("headlens: this Streamlit binds no socket of its own; connections left as Streamlit makes them",
              file=sys.stderr, flush=True)
        return False

    def bind(*args: Any, **kwargs: Any) -> socket.socket:
        return tcp_socket(original(*args, **kwargs))

    setattr(starlette_server, "_bind_socket", bind)
    return True
