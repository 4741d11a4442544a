"""No test may fail because the machine is slow (CI runs on a busy one): a wait lasts until what it waits for happens,
bounded only by the hang guard (tests/hang.py, HEADLENS_TEST_HANG_S). This scans the tests for the usual ways a time
limit creeps back in. A line whose literal number is no limit on the test (a product setting under test, a client
talking to a port that refuses at once) says so with `# not a limit`."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PATTERNS = {
    "a timeout of literal seconds": re.compile(r"timeout=(?!0\.)\d"),  # (a poll of 0.x s is a pause)
    "a time limit constant": re.compile(r"^[A-Z_]*(TIMEOUT|WAIT|LIMIT)[A-Z_]*\s*=\s*\d"),
    "a wait or join of literal seconds": re.compile(r"\.(wait|join)\((?!0\.)\d"),
    "a deadline of literal seconds": re.compile(r"(monotonic|perf_counter|time)\(\)\s*\+\s*\d"),
    "an assertion on elapsed time": re.compile(r"(monotonic|perf_counter|time)\(\)\s*-\s*\w+\s*<"),
    "a hypothesis deadline": re.compile(r"\bdeadline=(?!None)"),
}
APPTEST = re.compile(r"AppTest\.from_(file|function|string)\(")  # Streamlit's default: 3 s per run


def offending_lines(text: str) -> list[tuple[int, str]]:
    """(line number, why) for each line of `text` that sets a time limit."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if "# not a limit" in line:
            continue
        out += [(i, why) for why, pattern in PATTERNS.items() if pattern.search(line)]
        if (m := APPTEST.search(line)) and "default_timeout=" not in _call("\n".join(lines[i - 1:]), m.end()):
            out.append((i, "an AppTest with Streamlit's 3 s default timeout"))
    return out


def _call(text: str, start: int) -> str:
    """The arguments of the call whose "(" ends just before `start`."""
    depth = 1
    for j in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j]
    return text[start:]


def test_the_scan_finds_each_kind_of_limit():
    bad = ("r = subprocess.run(cmd, timeout=60)\nstarted.wait(10)\ndeadline = time.monotonic() + 30\n"
           "assert time.perf_counter() - t0 < 5\n@settings(deadline=500)\nat = AppTest.from_file(APP)\n"
           "x = f(timeout=2)  # not a limit: refused at once\nat = AppTest.from_file(APP, default_timeout=HANG_S)\n"
           "TIMEOUT = 300\nat = AppTest.from_function(script,\n    default_timeout=60)\nstop.wait(0.05)\n")
    assert [n for n, _ in offending_lines(bad)] == [1, 2, 3, 4, 5, 6, 9, 11]


def test_no_test_has_a_time_limit():
    found = [f"{f.name}:{n}: {why}" for f in sorted(TESTS.rglob("*.py")) if f.name not in ("hang.py", Path(__file__).name)
             for n, why in offending_lines(f.read_text())]
    assert not found, "time limits in tests (use tests/hang.py: HANG_S, wait_until, returns):\n" + "\n".join(found)
