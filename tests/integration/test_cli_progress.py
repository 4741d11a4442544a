"""The CLI's progress off a terminal: plain lines every few seconds, not a carriage-return redraw per step."""
from __future__ import annotations

import io

from backend.service.cli_output import Bar


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_one_plain_line_every_few_seconds():
    out = io.StringIO()
    bar = Bar("findings", stream=out)
    for i in range(400):  # a training's steps, in well under PLAIN_EVERY_S
        bar(i / 400, f"training: step {i}/400")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and text.count("\n") == 1 and text.startswith("findings: 0% · training: step 0/400 · ")


def test_off_a_terminal_the_lines_follow_the_clock(monkeypatch):
    out = io.StringIO()
    bar = Bar("scores", stream=out)
    monkeypatch.setattr(Bar, "PLAIN_EVERY_S", 0.0)
    for f in (0.25, 0.5, 1.0):
        bar(f, "")
    lines = out.getvalue().splitlines()
    assert [ln.split(" · ")[0] for ln in lines] == ["scores: 25%", "scores: 50%", "scores: 100%"]


def test_on_a_terminal_a_bar():
    out = Tty()
    bar = Bar("scores", stream=out)
    bar(0.5, "step 1/2")
    bar.close()
    assert bar.bar is not None and "\r" in out.getvalue()
