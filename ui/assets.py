"""The dashboard's frontend files for a new browser: gzip-compressed once per file, the chart bundle warmed early.

Streamlit serves its JS/CSS bundles uncompressed (9.7 MB for a Head map: Plotly's chunk alone 4.7 MB), on purpose:
compressing at the origin on every request costs CPU, and a proxy usually compresses. headlens runs without one,
and a collaborator opening a shared link over a network waits for those bytes. `AssetMiddleware`:

- answers a GET/HEAD of a file under `/static/` whose request accepts gzip with the file gzip-compressed (level 6,
  about 3.6x smaller), compressed once per process and kept (the files are content-hashed, so immutable), with
  Streamlit's own caching header (a year, immutable);
- adds to the HTML page a small script that imports the Plotly and DataFrame chunks once the page has loaded and
  the browser is idle (`warm_script`): Streamlit loads them only when the first chart's message arrives, and a new
  browser then spent 0.3-0.5 s evaluating Plotly's chunk (and as long fetching it) between the page's script
  having sent everything and the first chart drawn; warmed, that happens while Streamlit opens its session and the
  script runs on the server (a cached Head map in a new browser 0.5-1 s sooner on the 2-core development machine,
  bench/RESULTS.md). A returning browser has the files cached; it evaluates them early too (work it does anyway);
- with HEADLENS_UI_ASSETS=preload, `<link rel="modulepreload">` for those chunks instead (fetched with the page's
  own bundle: slower there, 5.9 s against 4.5 s); `gzip`: compression only; `plain`: Streamlit's own serving.

Everything else goes to Streamlit untouched. `install()` puts the middleware in front of Streamlit's own (through
`create_streamlit_middleware` of the pinned Streamlit 1.67's Starlette server); where that hook is missing it does
nothing and says so (bench/bench_ui.py measures each mode).
"""
from __future__ import annotations

import gzip
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPRESSIBLE = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".json": "application/json",
                ".map": "application/json", ".html": "text/html", ".txt": "text/plain"}
CACHE_CONTROL = b"public, immutable, max-age=31536000"
PRELOAD_CHUNKS = ("PlotlyChart", "DataFrame", "arrowFormatUtils")


def static_dir() -> Path:
    """Streamlit's folder of frontend files (`<streamlit>/static`)."""
    import streamlit

    return Path(streamlit.__file__).resolve().parent / "static"


def chunk_names(root: Path) -> list[str]:
    """The file names of the chunks in PRELOAD_CHUNKS under root/static/js, in PRELOAD_CHUNKS' order."""
    js = root / "static" / "js"
    if not js.is_dir():
        return []
    return sorted((p.name for p in js.glob("*.js") if p.name.split(".")[0] in PRELOAD_CHUNKS),
                  key=lambda n: (PRELOAD_CHUNKS.index(n.split(".")[0]), n))


def preload_links(root: Path) -> bytes:
    """`<link rel="modulepreload">` tags for the chunks in PRELOAD_CHUNKS found under root/static/js."""
    return "".join(f'<link rel="modulepreload" href="./static/js/{n}" />' for n in chunk_names(root)).encode()


def warm_script(root: Path) -> bytes:
    """An inline script that imports the chunks in PRELOAD_CHUNKS once the page has loaded and the browser is idle
    (while Streamlit opens its session and the page's script runs on the server), so that the first chart finds
    them fetched and evaluated. The same URLs as Streamlit's own lazy imports: one module each, evaluated once."""
    names = chunk_names(root)
    if not names:
        return b""
    urls = ",".join(f'"./static/js/{n}"' for n in names)
    return ("<script>addEventListener('load',()=>{const go=()=>{for(const u of [" + urls + "])"
            "import(u).catch(()=>{})};(window.requestIdleCallback||setTimeout)(go,{timeout:300})})</script>").encode()


def accepts_gzip(scope: Scope) -> bool:
    for k, v in scope.get("headers") or ():
        if k == b"accept-encoding":
            return re.search(rb"(^|[,\s])gzip(\s*;\s*q=(?!0(\.0*)?\s*(,|$))[\d.]+)?\s*(,|$)", v.lower()) is not None
    return False


class AssetMiddleware:
    """ASGI middleware: gzip-compressed static files (kept per process) and the warming script (or preload links)
    in the HTML page."""

    def __init__(self, app: ASGIApp, root: Path | None = None, base_url: str = ""):
        self.app = app
        self.root = (root or static_dir()).resolve()
        self.prefix = "/" + base_url.strip("/") if base_url.strip("/") else ""
        self.links = {"preload": preload_links, "gzip": lambda _: b""}.get(mode(), warm_script)(self.root)
        self._gz: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def precompress(self) -> None:
        """Compress every compressible file under root/static (a background thread at start: the first new
        browser then waits for none)."""
        for p in sorted((self.root / "static").rglob("*")):
            if p.suffix in COMPRESSIBLE:
                self.compressed(p.relative_to(self.root).as_posix())

    def compressed(self, rel: str) -> bytes | None:
        """The gzip bytes of root/rel (compressed on first use, then kept), or None when it is not a plain file
        inside root or not a compressible type."""
        if rel in self._gz:
            return self._gz[rel]
        path = (self.root / rel).resolve()
        if path.suffix not in COMPRESSIBLE or not path.is_relative_to(self.root / "static") or not path.is_file():
            return None
        with self._lock:
            if rel not in self._gz:
                self._gz[rel] = gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)
        return self._gz[rel]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if self.prefix and path.startswith(self.prefix):
            path = path[len(self.prefix):]
        if path.startswith("/static/") and accepts_gzip(scope):
            body = self.compressed(path.lstrip("/"))
            if body is not None:
                return await self._send(send, body, COMPRESSIBLE[Path(path).suffix], scope["method"] == "HEAD")
        if not self.links or "." in path.rsplit("/", 1)[-1] or path.startswith(
                ("/static/", "/_stcore/", "/media/", "/component/", "/app/")):
            return await self.app(scope, receive, send)
        # a page (the HTML shell, a few kB): asked for uncompressed, so that the script can go into its <head>
        plain = {**scope, "headers": [(k, v) for k, v in scope.get("headers") or () if k != b"accept-encoding"]}
        await self.app(plain, receive, self._with_links(send))

    async def _send(self, send: Send, body: bytes, ctype: str, head: bool) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", f"{ctype}; charset=utf-8".encode() if ctype.startswith("text/") else ctype.encode()),
            (b"content-encoding", b"gzip"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", CACHE_CONTROL), (b"vary", b"Accept-Encoding")]})
        await send({"type": "http.response.body", "body": b"" if head else body})

    def _with_links(self, send: Send) -> Send:
        """A `send` that adds `links` (the warming script or the preload links) to an uncompressed text/html
        response's <head>."""
        start: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def wrapped(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if (headers.get(b"content-type", b"").startswith(b"text/html")
                        and b"content-encoding" not in headers and message.get("status") == 200):
                    start = message
                    return
                return await send(message)
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if b"</head>" in body:
                body = body.replace(b"</head>", self.links + b"</head>", 1)
            headers = [(k, v) for k, v in start.get("headers") or [] if k != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        return wrapped


class Started(AssetMiddleware):
    """AssetMiddleware that compresses every file in a background thread as the server starts."""

    def __init__(self, app: ASGIApp, base_url: str = ""):
        super().__init__(app, base_url=base_url)
        threading.Thread(target=self.precompress, daemon=True, name="headlens-assets-gzip").start()


def mode() -> str:
    """HEADLENS_UI_ASSETS: `plain` (Streamlit's own serving), `gzip` (compression only), `preload` (compression
    and the preload links), else compression and the warming script."""
    return os.environ.get("HEADLENS_UI_ASSETS", "").strip().lower()


def enabled() -> bool:
    return mode() != "plain"


def install() -> bool:
    """Put AssetMiddleware in front of Streamlit's middleware (before the server starts); True when it did."""
    if not enabled():
        return False
    try:
        from starlette.middleware import Middleware
        from streamlit import config
        from streamlit.web.server.starlette import starlette_app
    except ImportError:
        return False
    original = getattr(starlette_app, "create_streamlit_middleware", None)
    if original is None:
        print("headlens: this Streamlit has no create_streamlit_middleware; frontend files served as Streamlit "
              "serves them (uncompressed)", file=sys.stderr, flush=True)
        return False

    def middleware() -> list:
        return [Middleware(Started, base_url=config.get_option("server.baseUrlPath") or ""), *original()]

    starlette_app.create_streamlit_middleware = middleware
    return True
