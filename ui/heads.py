"""Head selection shared by the Head map and Ablation pages: the state field `heads`, a multiselect bound to
it, quick picks (top-k by a map, random), and the callback that turns plotly selection events into heads."""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import streamlit as st

from . import figures, state

Head = tuple[int, int]


def names(n_layers: int, n_heads: int) -> list[str]:
    return [figures.head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]


def current(n_layers: int | None = None, n_heads: int | None = None) -> list[Head]:
    """Selected heads, those outside the model's shape dropped (a link made on another model)."""
    hs = [tuple(map(int, h)) for h in state.get().heads]
    if n_layers is not None and n_heads is not None:
        hs = [(l, h) for l, h in hs if l < n_layers and h < n_heads]
    return sorted(set(hs))  # type: ignore[arg-type]


def put(heads: Any) -> None:
    state.put("heads", sorted({(int(l), int(h)) for l, h in heads}))


def multiselect(n_layers: int, n_heads: int, label: str = "Selected heads", key_suffix: str = "") -> list[Head]:
    """A multiselect of heads (`L2.H6`) bound to the shared selection."""
    sel = current(n_layers, n_heads)
    if sel != current():
        put(sel)
    state.bind(st.multiselect, label, "heads", options=names(n_layers, n_heads),
               to_widget=lambda hs: [figures.head_name(h) for h in hs], from_widget=state.parse_heads,
               placeholder="Click cells on the head map, or pick here", help="Heads are named L<layer>.H<head>.")
    chosen = current(n_layers, n_heads)
    if len(chosen) > 3:  # the chips of a long selection scroll inside the box: list them in full below it
        st.caption(f"{len(chosen)} selected: " + ", ".join(figures.head_name(h) for h in chosen))
    return chosen


def chart_key(prefix: str) -> str:
    """Key of a selectable chart; it changes after every handled selection so plotly starts from scratch."""
    return f"{prefix}_{st.session_state.get('_hl_sel_nonce', 0)}"


def on_chart_select(key_prefix: str) -> Callable[[], None]:
    """Callback for `st.plotly_chart(on_select=...)`: a click toggles one head, a box or lasso adds all it holds."""

    def cb() -> None:
        ev = st.session_state.get(chart_key(key_prefix))
        sel = (ev or {}).get("selection") or {}
        picked: set[Head] = set()
        for p in sel.get("points") or []:
            if p.get("x") is None or p.get("y") is None:
                continue
            picked.add((int(round(float(p["y"]))), int(round(float(p["x"])))))
        if not picked:
            return
        cur = set(current())
        by_area = bool(sel.get("box") or sel.get("lasso"))
        if len(picked) == 1 and not by_area:
            cur ^= picked
            state.put("head", next(iter(picked)))  # the clicked head is the one to drill into
        else:
            cur |= picked
        put(cur)
        st.session_state["_hl_sel_nonce"] = st.session_state.get("_hl_sel_nonce", 0) + 1

    return cb


def quick_picks(scores: dict[str, Any] | None, n_layers: int, n_heads: int, key: str, compact: bool = False) -> None:
    """Buttons that replace the selection with the top k heads of a map, k random heads, or nothing.

    `compact` stacks them for a narrow column."""
    n = n_layers * n_heads
    k0 = min(int(scores["top_k"]) if scores and scores.get("top_k") else 3, n)  # the map's outlined top set's size
    wkey = f"w_quick_k_{key}_{k0}"  # a new Top heads size starts the count afresh

    def top(metric: str) -> None:
        k = int(st.session_state.get(wkey) or 1)
        put(figures.top_k(np.asarray(scores[metric], dtype=float), k))  # type: ignore[index]

    def rand() -> None:
        k = int(st.session_state.get(wkey) or 1)
        r = random.Random(f"ui-random-{state.get().seed}-{sorted(current())}")
        put(r.sample([(l, h) for l in range(n_layers) for h in range(n_heads)], min(k, n)))

    has = scores is not None
    if compact:
        rows = [st.columns([1, 1], vertical_alignment="bottom"), st.columns(2), st.columns(2)]
        slots = [rows[0][0], rows[0][1], rows[1][0], rows[1][1], rows[2][0], rows[2][1]]
    else:
        slots = st.columns([1.2, 1, 1, 1, 1, 1], vertical_alignment="bottom")
    slots[0].number_input("Quick pick: k heads", min_value=1, max_value=n, value=k0, key=wkey,
                          help="How many heads the buttons select (they replace the current selection); at first "
                               "the sidebar's *Top heads*, the set the map outlines.")
    slots[1].button("Top TR", on_click=top, args=("tr",), disabled=not has, key=f"q_tr_{key}", width="stretch")
    slots[2].button("Top TL", on_click=top, args=("tl",), disabled=not has, key=f"q_tl_{key}", width="stretch")
    slots[3].button("Top induction", on_click=top, args=("induction",), disabled=not has, key=f"q_ind_{key}",
                    width="stretch")
    slots[4].button("Random", on_click=rand, key=f"q_rand_{key}", width="stretch",
                    icon=None if compact else ":material/casino:")  # a narrow column: the label alone fits
    slots[5].button("Clear", on_click=put, args=([],), key=f"q_clear_{key}", width="stretch",
                    icon=None if compact else ":material/close:")
