"""ui/assets.py: the dashboard's frontend files gzip-compressed for a new browser, the chart bundle warmed early."""
from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import pytest

from ui import assets

JS = b"function f(){return 1}\n" * 400


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    js = tmp_path / "static" / "js"
    js.mkdir(parents=True)
    (js / "PlotlyChart.abc123.js").write_bytes(JS)
    (js / "Other.def456.js").write_bytes(JS)
    (tmp_path / "static" / "media").mkdir()
    (tmp_path / "static" / "media" / "font.woff2").write_bytes(b"\x00" * 100)
    (tmp_path / "index.html").write_bytes(b"<html><head><title>x</title></head><body></body></html>")
    return tmp_path


def call(mw: assets.AssetMiddleware, path: str, accept: bytes | None = b"gzip, deflate, br",
         method: str = "GET") -> tuple[dict[str, Any], bytes, list[dict[str, Any]]]:
    """(response start, body, the scopes the inner app saw)."""
    out: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    headers = [] if accept is None else [(b"accept-encoding", accept)]
    asyncio.run(mw({"type": "http", "method": method, "path": path, "headers": headers}, None, send))  # type: ignore[arg-type]
    return out[0], b"".join(m.get("body", b"") for m in out[1:]), mw.app.seen  # type: ignore[attr-defined]


class Inner:
    """Streamlit's stand-in: the HTML page for a page path, the plain file for /static/."""

    def __init__(self, root: Path):
        self.root, self.seen = root, []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append(scope)
        path = scope["path"]
        body, ctype = ((self.root / path.lstrip("/")).read_bytes(), b"text/javascript") if path.startswith("/static/") \
            else ((self.root / "index.html").read_bytes(), b"text/html")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})


def test_a_static_file_comes_gzip_compressed_once_and_equal(root: Path) -> None:
    mw = assets.AssetMiddleware(Inner(root), root=root)
    start, body, seen = call(mw, "/static/js/PlotlyChart.abc123.js")
    headers = dict(start["headers"])
    assert headers[b"content-encoding"] == b"gzip" and int(headers[b"content-length"]) == len(body)
    assert gzip.decompress(body) == JS and len(body) < len(JS) / 5
    assert b"immutable" in headers[b"cache-control"] and not seen  # Streamlit not asked
    assert call(mw, "/static/js/PlotlyChart.abc123.js")[1] is mw.compressed("static/js/PlotlyChart.abc123.js")


@pytest.mark.parametrize("accept", [None, b"identity", b"gzip;q=0", b"br"])
def test_without_gzip_in_accept_encoding_streamlit_serves_it(root: Path, accept: bytes | None) -> None:
    start, body, seen = call(assets.AssetMiddleware(Inner(root), root=root), "/static/js/Other.def456.js", accept)
    assert body == JS and b"content-encoding" not in dict(start["headers"]) and len(seen) == 1


def test_gzip_with_a_weight_counts(root: Path) -> None:
    assert assets.accepts_gzip({"headers": [(b"accept-encoding", b"br, gzip;q=0.5")]})
    assert not assets.accepts_gzip({"headers": [(b"accept-encoding", b"x-gzip-not")]})


@pytest.mark.parametrize("path", ["/static/media/font.woff2", "/static/js/../../index.html", "/static/js/nope.js"])
def test_only_compressible_files_inside_static_are_answered_here(root: Path, path: str) -> None:
    mw = assets.AssetMiddleware(Inner(root), root=root)
    assert mw.compressed(path.lstrip("/")) is None


def test_the_page_gets_the_preload_links_in_its_head(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADLENS_UI_ASSETS", "preload")
    mw = assets.AssetMiddleware(Inner(root), root=root)
    start, body, seen = call(mw, "/Head_map")
    assert body.count(b'rel="modulepreload"') == 1 and b"PlotlyChart.abc123.js" in body
    assert b"Other" not in body and body.index(b"modulepreload") < body.index(b"</head>")
    assert int(dict(start["headers"])[b"content-length"]) == len(body)
    assert all(k != b"accept-encoding" for k, _ in seen[0]["headers"])  # asked uncompressed, to be edited


def test_the_page_gets_a_script_that_imports_the_chart_chunks_once_loaded(root: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADLENS_UI_ASSETS", raising=False)
    (root / "static" / "js" / "DataFrame.fff999.js").write_bytes(JS)
    start, body, _ = call(assets.AssetMiddleware(Inner(root), root=root), "/Head_map")
    script = body[body.index(b"<script>"):body.index(b"</script>")]
    assert body.count(b"<script>") == 1 and body.index(b"</script>") < body.index(b"</head>")
    assert b"addEventListener('load'" in script and b"import(u)" in script and b"modulepreload" not in body
    # the chart's chunk first, then the table's, at the URLs Streamlit imports them from; no other file
    assert script.index(b'"./static/js/PlotlyChart.abc123.js"') < script.index(b'"./static/js/DataFrame.fff999.js"')
    assert b"Other" not in script
    assert int(dict(start["headers"])[b"content-length"]) == len(body)


def test_gzip_mode_leaves_the_page_as_streamlit_serves_it(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADLENS_UI_ASSETS", "gzip")
    start, body, seen = call(assets.AssetMiddleware(Inner(root), root=root), "/Head_map")
    assert body == (root / "index.html").read_bytes() and seen[0]["headers"] == [(b"accept-encoding", b"gzip, deflate, br")]
    assert gzip.decompress(call(assets.AssetMiddleware(Inner(root), root=root), "/static/js/Other.def456.js")[1]) == JS


def test_no_chart_chunk_no_script(tmp_path: Path) -> None:
    (tmp_path / "static" / "js").mkdir(parents=True)
    assert assets.warm_script(tmp_path) == b"" and assets.warm_script(tmp_path / "missing") == b""


def test_a_base_url_is_stripped(root: Path) -> None:
    mw = assets.AssetMiddleware(Inner(root), root=root, base_url="/lab/")
    start, body, _ = call(mw, "/lab/static/js/PlotlyChart.abc123.js")
    assert gzip.decompress(body) == JS


def test_head_answers_no_body(root: Path) -> None:
    start, body, _ = call(assets.AssetMiddleware(Inner(root), root=root), "/static/js/PlotlyChart.abc123.js",
                          method="HEAD")
    assert body == b"" and int(dict(start["headers"])[b"content-length"]) > 0


def test_plain_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADLENS_UI_ASSETS", "plain")
    assert assets.install() is False


def test_install_puts_it_first_in_streamlits_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.web.server.starlette import starlette_app

    monkeypatch.delenv("HEADLENS_UI_ASSETS", raising=False)
    monkeypatch.setattr(starlette_app, "create_streamlit_middleware", starlette_app.create_streamlit_middleware)
    monkeypatch.setattr(assets.threading, "Thread", lambda **kw: type("T", (), {"start": lambda self: None})())
    assert assets.install() is True
    stack = starlette_app.create_streamlit_middleware()
    assert stack[0].cls is assets.Started and len(stack) >= 2
    monkeypatch.setenv("HEADLENS_UI_ASSETS", "preload")
    real = assets.Started(Inner(assets.static_dir()))
    assert b"PlotlyChart" in real.links  # the pinned Streamlit's chart chunk is found


def test_by_default_it_compresses_without_preload_links(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADLENS_UI_ASSETS", raising=False)
    mw = assets.AssetMiddleware(Inner(root), root=root)
    assert b"modulepreload" not in call(mw, "/Head_map")[1]
    assert gzip.decompress(call(mw, "/static/js/Other.def456.js")[1]) == JS
