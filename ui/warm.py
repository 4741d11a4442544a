"""`python -m ui.warm run app.py [streamlit options]`: Streamlit, with the dashboard's modules imported and plotly's
figure code warmed first (and the service's capabilities fetched, when HEADLENS_BACKEND_URL names it).

A fresh Streamlit process imports the pages' modules (pandas, plotly, ui/) on its first script run and plotly loads
its property validators the first time a figure is built: 1-2 s that the first visitor after a launch waited on
(measured in bench/bench_ui.py). `launch` starts the dashboard through here, so that cost is paid before it says
it is running. It also installs ui/assets.py's middleware (the frontend files gzip-compressed for a new browser,
the chart chunks warmed early) and ui/nodelay.py's socket (no Nagle delay on kept-alive connections).
"""
from __future__ import annotations

import os
import sys
import threading
import time


def warm() -> float:
    """Import what the pages import and build one figure of each kind the first views draw; seconds taken."""
    t0 = time.perf_counter()
    import numpy as np
    import pandas as pd  # noqa: F401

    from . import (api, compare, figures, fit, head_view, heads, jobs, layout, metrics, model_box,  # noqa: F401
                   sections, share, snippets, state, sweep_figures)
    from .ltv import figures as ltv_figures  # noqa: F401
    from .site import figures as site_figures  # noqa: F401
    from .tsla import patching_figures, steering_figures  # noqa: F401

    z = np.arange(6, dtype=float).reshape(2, 3)
    figures.head_heatmap(z, "tr", selected=[(0, 1)], top=2, title="warm")
    figures.layer_distribution({"n_layers": 2, "tr": z, "tl": z, "induction": z}, 2)
    figures.icl_curve({"shots": [0, 1], "accuracy": [0.0, 1.0], "label_accuracy": [0.5, 1.0], "tr_ratio": [0.5, 1.0]})
    if os.environ.get("HEADLENS_BACKEND_URL"):  # launch starts the service first: its capabilities, kept per process,
        # fetched in the background (they wait while the service loads a model; Streamlit must not)
        threading.Thread(target=_capabilities, daemon=True, name="headlens-warm-caps").start()
    return time.perf_counter() - t0


def _capabilities() -> None:
    from . import api, layout

    try:
        layout.capabilities()
    except api.ApiError:
        pass  # the first page asks (and says what is wrong)


def main(argv: list[str] | None = None) -> None:
    took = warm()
    print(f"dashboard modules warmed in {took:.1f} s", file=sys.stderr, flush=True)
    from streamlit.web import cli

    from . import assets, nodelay

    assets.install()  # frontend files gzip-compressed for a new browser (ui/assets.py)
    nodelay.install()  # no 40 ms Nagle delay per file on a kept-alive connection (ui/nodelay.py)
    sys.argv = ["streamlit", *(sys.argv[1:] if argv is None else argv)]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
