"""Checks shared by the page tests (Streamlit's AppTest): a clean run, a chart's figure, a figure's arrays."""
from __future__ import annotations

import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest


def assert_clean(at: AppTest) -> None:
    """No traceback and no st.error on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def vals(x) -> np.ndarray:
    """An array of a figure's JSON: a list, or plotly's typed form {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(x, dict) and "bdata" in x:
        a = np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"]))
        return a.reshape([int(n) for n in str(x["shape"]).split(",")]) if x.get("shape") else a
    return np.asarray(x, dtype=float)


def figure(at: AppTest, key: str) -> dict:
    """The plotly figure (as JSON) of the chart whose key ends with `key`."""
    found = [json.loads(el.proto.spec) for el in at.get("plotly_chart") if el.proto.id.endswith(key)]
    assert found, f"no chart {key!r} on the page"
    return found[0]
