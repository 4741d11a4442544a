"""Checking and echoing user-given text, and durations in words: one rule for every floor (no imports beyond the
standard library)."""
from __future__ import annotations

MAX_NAME_CHARS = 1024
MAX_PART_BYTES = 255


def clip(text: object, n: int = 200) -> str:
    """`text` (any object, via str) cut to at most `n` characters, with the cut marked, for echoing user
    input in an error message: `f"unknown task {clip(name)!r}"`. No error answer may echo more than this."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= n:
        return s
    return f"{s[:n]}...[{len(s) - n} more characters]"


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot be a model name (too long for the filesystem: over MAX_NAME_CHARS characters or a
    path part over MAX_PART_BYTES bytes; control characters), or None. The message names the field `model`
    and shows at most ~200 characters of the name."""
    if len(name) > MAX_NAME_CHARS:
        return f"model: the name is too long ({len(name)} characters; at most {MAX_NAME_CHARS}): {clip(name)!r}"
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in name.replace("\\", "/").split("/")),
                  default=0)
    if longest > MAX_PART_BYTES:
        return (f"model: a part of the name between slashes is {longest} bytes long, over the filesystem's "
                f"{MAX_PART_BYTES}: {clip(name)!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"model: the name holds control characters: {clip(name)!r}"
    return None


def describe_seconds(seconds: float | None, low: float | None = None, high: float | None = None) -> str:
    """`about 40 s`, `about 3 min`, `about 2.5 h`; with a wide range (`high` over 2 x `low`): `20 s to 1 min`."""
    if seconds is None:
        return "unknown"
    if low is not None and high is not None and high > 2 * max(low, 1e-9) and high >= 2:
        return f"{_span(low)} to {_span(high)}"
    return f"about {_span(seconds)}"


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
