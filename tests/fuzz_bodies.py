"""Generated request bodies for fuzzing the service (shared by tests/integration/test_fuzz.py and bench/fuzz_service.py).

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


# -- admission: plausible bodies near the limits, for POST /jobs/estimate against POST /jobs (issue 24) ---------------
ADMIT_MODELS = ["default", "default", "default", "nope", "no-such-org/no-such-model", "/no/such/dir", "headlens-tiny"]
ADMIT_TASKS = ["syn-antonym", "syn-sentiment", "sentiment", "antonym", "nope", "upload:0123456789abcdef",
               "/etc/passwd", "../x"]
SMALL_INTS = st.one_of(st.integers(-2, 40), st.sampled_from([0, 1, 31, 32, 33, 64, 1000, 10**6]))


def _near(draw, name: str, default=None):
    """A value for field `name` near where the model's shape or the limits draw the line (the embedded model: 4
    layers x 8 heads; counts around 0 and the limits), of the type of its `default`, or now and then anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    if name == "heads":
        return draw(st.lists(st.tuples(st.integers(-1, 9), st.integers(-1, 12)).map(list), max_size=4))
    if name == "head":
        return [draw(st.integers(-1, 9)), draw(st.integers(-1, 12))]
    if name in ("layer", "pca_layer"):
        return draw(st.one_of(st.none(), st.integers(-1, 9), st.just("all"), st.lists(st.integers(-1, 9), max_size=4)))
    if name == "tasks":
        return draw(st.one_of(st.none(), st.lists(st.sampled_from([*ADMIT_TASKS, "syn-size"]), max_size=4)))
    if name == "load":
        return draw(st.sampled_from(LOADS))
    if isinstance(default, bool):
        return draw(st.booleans())
    if isinstance(default, int) or name in ("top_k", "perturbations"):
        return draw(st.one_of(st.integers(-1, 12), SMALL_INTS, st.sampled_from([50, 200, 5000])))
    if isinstance(default, list) and all(isinstance(x, int) for x in default):
        return draw(st.lists(SMALL_INTS, max_size=5))
    return default if draw(st.integers(0, 3)) else draw(values)


@st.composite
def admission_bodies(draw) -> dict:
    """A body of a real kind with the default model mostly, a real task mostly, and a few of the kind's own
    fields near the lines the admission draws (the model's heads and layers, the limits, the task names)."""
    from backend.analysis.kinds import get_kind

    kind = draw(st.sampled_from(sorted(KINDS)))
    spec = get_kind(kind)
    body: dict = {"kind": kind}
    if spec.uses_model and draw(st.integers(0, 9)) > 0:
        body["model"] = draw(st.sampled_from(ADMIT_MODELS))
    if spec.uses_task and draw(st.integers(0, 9)) > 0:
        body["task"] = draw(st.sampled_from(ADMIT_TASKS[:4] * 3 + ADMIT_TASKS[4:]))
    fields = spec.params.model_fields
    own = sorted(fields)
    required = [n for n in own if fields[n].is_required()]  # `heads` of ablate, `head` of head: mostly there
    chosen = draw(st.lists(st.sampled_from(own), max_size=3, unique=True)) if own else []
    for name in chosen + [n for n in required if n not in chosen and draw(st.integers(0, 9))]:
        field = spec.params.model_fields[name]
        body[name] = _near(draw, name, field.get_default(call_default_factory=True))
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


# -- saved tensors: `load` values, and tensor files for POST /tensors (issue 18) ----------------------------------
TENSOR_KINDS = ["site", "ltv", "ltv_train", "site_transfer", "methods", "ltv_tasks"]
LOADS = ["/etc/passwd", "/proc/self/environ", "../../../../etc/passwd", "~/.ssh/id_rsa", "tensors/../../x",
         "cache/tensors/../../../etc/passwd", "file:///etc/passwd", "C:\\Windows\\win.ini", "ltv-" + "0" * 32,
         "site-" + "0" * 32, "site-" + "0" * 31 + "/", "ltv-" + "A" * 32, "site-" + "0" * 32 + "/../../x", "\x00",
         "a" * 300 + ".safetensors", ""]


@st.composite
def tensor_bodies(draw, ids: tuple[str, ...] = ()) -> dict:
    """A POST /jobs body of a kind that reads or trains tensors, `load` a path, a traversal, an id (of a stored file
    among `ids`, or not) or anything else."""
    body: dict = {"kind": draw(st.sampled_from(TENSOR_KINDS)),
                  "model": draw(st.one_of(st.just("default"), st.sampled_from(MODELS))),
                  "task": draw(st.one_of(st.just("syn-antonym"), st.sampled_from(TASKS)))}
    body["load"] = draw(st.one_of(st.sampled_from(LOADS + list(ids)), st.text(max_size=60), values))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        body[name] = draw(values)
    return body


def valid_tensor_file(kind: str) -> bytes:
    """A small, sound headlens tensor file (no model needed: 2 layers x 2 heads, d_model 16)."""
    import torch

    from backend.analysis.primitives.saved import FORMAT, encode

    g = torch.Generator().manual_seed(0)
    meta = {"format": FORMAT, "kind": kind, "model": "fuzz", "fingerprint": "0" * 64, "d_model": "16",
            "n_layers": "2", "n_heads": "2", "head_dim": "8", "task_hash": "", "task": "fuzz",
            "recipe": json.dumps({"layers": [1], "positions": [-1]})}
    if kind == "ltv":
        return encode({"theta": torch.randn(1, 16, generator=g)}, meta)
    logits = torch.randn(2, 2, generator=g)
    return encode({"alpha_logits": logits, "alpha": torch.sigmoid(logits),
                   "task_embedding": torch.randn(2, 2, 8, generator=g)}, meta)


@st.composite
def tensor_files(draw) -> bytes:
    """A POST /tensors body: a sound file, or one mutated: truncated, bytes overwritten, the header's length or
    JSON replaced, a value made NaN, infinite or huge, a metadata field changed, or random bytes."""
    import struct

    base = valid_tensor_file(draw(st.sampled_from(["ltv", "site"])))
    how = draw(st.integers(0, 7))
    if how == 0:
        return base
    if how == 1:
        return base[:draw(st.integers(0, len(base) - 1))]
    if how == 2:
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if how == 3:
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + base[8:]
    if how == 4:
        text = json.dumps(draw(values), default=str).encode()
        return struct.pack("<Q", len(text)) + text + base[8 + struct.unpack("<Q", base[:8])[0]:]
    if how in (5, 6):
        from backend.analysis.primitives.saved import decode, encode

        tensors, meta = decode(base, "x")
        if how == 5:
            name = draw(st.sampled_from(sorted(tensors)))
            flat = tensors[name].view(-1)
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.floats(allow_nan=True, allow_infinity=True,
                                                                          width=32))
        else:
            meta[draw(st.sampled_from(sorted(meta) + ["extra"]))] = draw(st.text(max_size=30))
        return encode(tensors, meta)
    return draw(st.binary(max_size=400))
