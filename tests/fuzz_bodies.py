"""Generated request bodies for fuzzing the service (shared by tests/test_fuzz.py and bench/fuzz_service.py).

Bodies are mostly plausible: a real kind with real field names and wrong, extreme, nested or oversized values,
so the fuzzing reaches validation deep inside, not only the first check.
"""
from __future__ import annotations

import json

from hypothesis import strategies as st

from backend.analysis.kinds import KINDS

FIELDS = sorted({f for k in KINDS.values() for f in k.params.model_fields} | {"model", "task", "kind"})
TASKS = ["sentiment", "syn-sentiment", "upload:0123456789abcdef", "no-such-task", "../etc/passwd", ""]
MODELS = ["default", "no-such-org/no-such-model", "/no/such/dir", "../x", "~root", "a" * 300, "\x00", ""]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                    st.sampled_from(["all", "tr", "zero", "last", "nan", "1e999", "-1", "3.5"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=20)


@st.composite
def job_bodies(draw) -> dict:
    """A POST /jobs body: a kind (real or not), model and task (real, odd or missing), and fields."""
    body: dict = {}
    if draw(st.booleans()) or draw(st.booleans()):
        body["kind"] = draw(st.one_of(st.sampled_from(sorted(KINDS)), st.text(max_size=12), scalars))
    if draw(st.booleans()):
        body["model"] = draw(st.one_of(st.sampled_from(MODELS), values))
    if draw(st.booleans()):
        body["task"] = draw(st.one_of(st.sampled_from(TASKS), values))
    for name in draw(st.lists(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)), max_size=6)):
        body[name] = draw(values)
    if draw(st.integers(0, 20)) == 0:  # now and then something big
        body[draw(st.sampled_from(FIELDS))] = draw(st.sampled_from(["x" * 100_000, list(range(5000)),
                                                                     [[[[[]]]]] * 100]))
    return body


@st.composite
def uploads(draw) -> tuple[str, bytes]:
    """A POST /tasks/upload file: an odd or real name and content that is often almost valid."""
    name = draw(st.one_of(st.sampled_from(["t.json", "t.jsonl", "t.csv", "t.tsv", "t.ndjson", "t.txt", "", ".json",
                                           "../../x.json", "a" * 300 + ".json"]), st.text(max_size=20)))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        content = json.dumps(draw(st.lists(st.dictionaries(st.sampled_from(["input", "output", "x"]), values,
                                                           max_size=3), max_size=8)), default=str)
    elif kind == 1:
        content = "\n".join(json.dumps(draw(st.dictionaries(st.sampled_from(["input", "output"]), scalars,
                                                           max_size=2)), default=str) for _ in range(draw(
                                                               st.integers(0, 8))))
    elif kind == 2:
        content = "input,output\n" + "\n".join(",".join(draw(st.lists(st.text(max_size=8), max_size=3)))
                                               for _ in range(draw(st.integers(0, 8))))
    elif kind == 3:
        depth = draw(st.integers(1, 5000))
        content = "[" * depth + "]" * depth
    else:
        return name, draw(st.binary(max_size=300))
    return name, content.encode("utf-8", "surrogatepass")
