"""Token roles of a template-built prompt, and positions aligned by role between two prompts (no torch here).

A k-shot prompt is `demo(x_1, y_1) ... demo(x_k, y_k) query(x)` (`tasks.base.Template`): each demonstration is
`pre x_j mid y_j post`, the query `pre x mid'` (mid' = mid without its trailing spaces, which go onto the answer).
Each character belongs to one segment, and each token (by its character offsets) to the segment of highest
priority that it overlaps (label > query > input > separator):

    label:j    demonstration j's label (j from 1), with the spaces before it (the answer's own, `" positive"`)
    input:j    demonstration j's input
    query      the query's input
    separator  the template's own text: `pre`, `mid`, `post` of every demonstration and of the query
    last       the last token (also a member of its own segment, usually a separator)

Tokens with no characters (a BOS token) have no segment. `ROLES` are the roles a position may be chosen by
(`label` alone: every demonstration's label tokens; `input` alone: every demonstration's input tokens).

Two prompts of the same query (a clean one and its corrupted counterpart) differ in length, so a role's positions
are paired from the end of the role: its last token in one with its last token in the other, and so on, as far as
the shorter goes (`align`). For positions by offset (`offsets`), -1 is the last token of both, -2 the one before, as
everywhere in headlens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ...errors import BadInput

PRIORITY = ("label", "query", "input", "separator")
ROLES = ("last", "query", "separator", "label", "input")
"""Roles a position may be named by, besides `label:j` / `input:j` (one demonstration's) and `-n` (an offset)."""


class RoleError(BadInput):
    """A position role that does not exist in a prompt, or a prompt whose roles cannot be read (a BadInput: the
    user's choice of position, answered in one sentence)."""


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    role: str  # "label:j", "input:j", "query", "separator"


def segments(text: str, template: str, shots: int, query: str) -> list[Segment]:
    """The character segments of `text`, a prompt built from `template` (with `{input}` and `{output}`) with `shots`
    demonstrations and the query input `query`; a RoleError when the text is not such a prompt."""
    pre, rest = template.split("{input}")
    mid, post = rest.split("{output}")
    mid_q = mid.rstrip(" ")  # the spaces after it are the answer's own: they go with the label
    tail = pre + query + mid_q
    if not text.endswith(tail):
        raise RoleError("the prompt does not end with its query as the template writes it")
    body = text[:len(text) - len(tail)]
    out: list[Segment] = []

    def add(start: int, end: int, role: str) -> None:
        if end > start:
            out.append(Segment(start, end, role))

    pos = 0
    for j in range(1, shots + 1):
        if not body.startswith(pre, pos):
            raise RoleError(f"demonstration {j} does not start as the template does")
        add(pos, pos + len(pre), "separator")
        x0 = pos + len(pre)
        m = body.find(mid, x0) if mid else x0
        if m < 0:
            raise RoleError(f"demonstration {j} has no {mid!r} after its input")
        add(x0, m, f"input:{j}")
        add(m, m + len(mid_q), "separator")
        y0 = m + len(mid_q)
        if j == shots:
            y1 = len(body) - len(post)
        elif post:
            y1 = body.find(post, m + len(mid))
        elif pre:
            y1 = body.find(pre, m + len(mid))
        else:
            raise RoleError("a template with no text after {output} and none before {input} has no boundary "
                            "between demonstrations")
        if y1 < m + len(mid):
            raise RoleError(f"demonstration {j}'s label has no end")
        add(y0, y1, f"label:{j}")
        add(y1, y1 + len(post), "separator")
        pos = y1 + len(post)
    if pos != len(body) or "".join(text[s.start:s.end] for s in out) != body:
        raise RoleError(f"the prompt's demonstrations do not read as {shots} filled-in templates")
    q0 = len(body)
    add(q0, q0 + len(pre), "separator")
    add(q0 + len(pre), q0 + len(pre) + len(query), "query")
    add(q0 + len(pre) + len(query), len(text), "separator")
    return out


def token_roles(offsets: Sequence[tuple[int, int]], segs: Sequence[Segment]) -> list[str | None]:
    """The role of each token, from its character offsets (start, end) into the prompt: the highest-priority
    segment it overlaps; None for a token of no characters (a special token)."""
    out: list[str | None] = []
    for a, b in offsets:
        best, rank = None, len(PRIORITY)
        for s in segs:
            if a < s.end and s.start < b:
                r = PRIORITY.index(s.role.split(":")[0])
                if r < rank:
                    best, rank = s.role, r
        out.append(best)
    return out


def positions(roles: Sequence[str | None], name: str) -> list[int]:
    """The token positions of role `name` (`ROLES`, `label:j`, `input:j`, or `-n`: the n-th token from the end) in
    a prompt whose tokens have `roles`, in order; [] where the prompt has none."""
    n = len(roles)
    if re.fullmatch(r"-[1-9][0-9]*", name):
        k = int(name)
        return [n + k] if n + k >= 0 else []
    if name == "last":
        return [n - 1] if n else []
    if name in ("label", "input"):
        return [i for i, r in enumerate(roles) if r is not None and r.split(":")[0] == name]
    if name in ("query", "separator") or re.fullmatch(r"(label|input):[1-9][0-9]*", name):
        return [i for i, r in enumerate(roles) if r == name]
    raise RoleError(f"unknown position {name!r}: give one of {', '.join(ROLES)}, label:j or input:j (demonstration "
                    f"j, from 1), or a negative offset (-1: the last token)")


def check_name(name: str) -> str:
    """`name` if it names a position (else the RoleError `positions` gives)."""
    positions([], name)
    return name


def align(target: Sequence[str | None], source: Sequence[str | None], name: str) -> list[tuple[int, int]]:
    """(target position, source position) pairs of role `name`, paired from the role's end: as many as the shorter
    of the two has. A RoleError when either prompt has none."""
    t, s = positions(target, name), positions(source, name)
    if not t or not s:
        which = "the corrupted" if not t else "the clean"
        raise RoleError(f"position {name!r} is absent from {which} prompt")
    k = min(len(t), len(s))
    return list(zip(t[len(t) - k:], s[len(s) - k:]))


def shared_roles(target: Sequence[str | None], source: Sequence[str | None], shots: int) -> list[str]:
    """The roles of the layer x position map present in both prompts, in prompt order: each demonstration's label,
    the separators, the query, the last token."""
    names = [f"label:{j}" for j in range(1, shots + 1)] + ["separator", "query", "last"]
    return [n for n in names if positions(target, n) and positions(source, n)]


def offsets_of(tokenizer: object, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each token's (start, end) character offsets in `text`, for `ids`, the prompt's tokens as encoded (a BOS token
    the convention prepended gets (0, 0)). Needs a fast tokenizer; a RoleError when the ids differ."""
    if not getattr(tokenizer, "is_fast", False):
        raise RoleError("position roles need a fast tokenizer (character offsets of each token)")
    enc = tokenizer(text, return_offsets_mapping=True)  # type: ignore[operator]
    got, offs = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if len(got) + 1 == len(ids) and list(ids[1:]) == got:  # the BOS the convention added
        got, offs = list(ids), [(0, 0), *offs]
    if got != list(ids):
        raise RoleError("the tokenizer's offsets do not match the prompt's tokens")
    bos = getattr(tokenizer, "bos_token_id", None)
    return [(0, 0) if (i == bos and a == b == 0) else (int(a), int(b)) for i, (a, b) in zip(got, offs)]
