"""Click-to-view timings of the dashboard in a real browser (a benchmark, not a test).

    python bench/bench_ui.py [--repo PATH] [--label after] [--json out.json] [--model smollm2-135m]
    python bench/bench_ui.py --smoke      # one first Home run, failing on any error (the CI test)

Starts `python -m backend launch` from `--repo` (default: this checkout) on free ports with an empty cache, drives
headless Chromium at 1600 x 1000 through Selenium, and measures, on the default model (`syn-*` tasks) or `--model`
(a preset: the natural-language `sentiment` task), 8 shots and 50 prompts (the default model's tasks' query pools
cap them at 19-20):

- first Home run: from the click on Run to the summary metrics and the ICL curve drawn, the page idle (a task and
  seed not computed before; repeated on 3 seeds, the first one in a fresh service);
- live toggling: on the Ablation page, from a click on a quick pick that selects 3 new heads to the before/after
  table of those heads, idle (4 clicks; the first is the first toggle after opening the page); then, where the
  curves wait for their Run (a real model), Run pressed and 3 more toggles while the curves run, each to its result
  drawn (`toggle_behind_curves_s`);
- a cached page from a link: a fresh browser session opening a Head map / Steering link whose results are cached;
  from the page shell (the browser's load event) to the view drawn and idle, and to the map itself drawn;
- the same Head map link right after a new launch on the same cache (`after_launch`: fresh service and dashboard
  processes; from the navigation);
- `fresh` (issue 25): a page switch to the cached Head map in a session (from the Sweeps page, through the
  sidebar) against the same link opened in a new browser each time (a new profile: no HTTP cache, no cookies),
  over loopback and over an emulated 50 Mbit/s, 20 ms network (a collaborator's link; bytes transferred counted);
  HEADLENS_UI_ASSETS=plain (Streamlit's own uncompressed serving), `gzip` (compressed, the chart chunks not warmed)
  or `preload` in this script's environment measures the other ways ui/assets.py can serve the frontend, and
  HEADLENS_UI_NODELAY=off Streamlit's socket without TCP_NODELAY (ui/nodelay.py);
- `partial` (issue 25): a Head map link of a seed not computed yet: the first partial map drawn ("Partial: 4 of 50
  prompts"), from the navigation or from the click on Run when the page waits for it, and the final map.

"Idle": Streamlit's running indicator and every progress bar gone. Times come from the browser side
(time.perf_counter around WebDriver calls, polled every 20 ms). `--repo` lets the same script measure another
checkout (e.g. a git worktree of an older commit) for a before/after comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.02
QS = "model=default&shots=8&prompts=50"
TASK = "syn-sentiment"
MODEL = "default"


# --smoke is the CI test (tests/integration/test_bench_smoke.py), on machines as busy as they come: there every wait of this
# script is bounded only by the tests' hang guard (HEADLENS_TEST_HANG_S, tests/hang.py), not by its own limits
HANG_S: float | None = None


def waited(seconds: float) -> float:
    """How long a wait of `seconds` may last: as long as the hang guard under --smoke."""
    return max(seconds, HANG_S) if HANG_S else seconds


def smoke_waits() -> None:
    """--smoke: waits bounded by the tests' hang guard, here and in the launcher (HEADLENS_LAUNCH_TIMEOUT)."""
    global HANG_S
    sys.path.insert(0, str(REPO / "tests"))
    from hang import HANG_S as hang_s

    HANG_S = hang_s
    os.environ["HEADLENS_LAUNCH_TIMEOUT"] = str(hang_s)


def use_model(model: str) -> None:
    """Measure on `model`: the default model's `syn-sentiment`, or a real model's `sentiment`."""
    global QS, TASK, MODEL
    MODEL, TASK = model, "syn-sentiment" if model == "default" else "sentiment"
    QS = f"model={model}&shots=8&prompts=50"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Launch:
    """`python -m backend launch` from `repo`, on free ports, with its own cache folder."""

    def __init__(self, repo: Path, cache: str | None = None, ports: tuple[int, int] | None = None):
        self.port, self.backend_port = ports or (free_port(), free_port())
        self.cache = cache or tempfile.mkdtemp(prefix="bench-ui-cache-")
        self.log = open(Path(self.cache) / "launch.log", "wb")
        self.trace = str(Path(self.cache) / "ui-trace.log")
        env = dict(os.environ, HEADLENS_CACHE_DIR=self.cache, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
                   HEADLENS_UI_TRACE=self.trace, HEADLENS_LOG=str(Path(self.cache) / "servers.log"))
        for var in ("HEADLENS_BACKEND_URL", "HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT"):
            env.pop(var, None)
        self.proc = subprocess.Popen([sys.executable, "-m", "backend", "launch", "--no-browser", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--backend-port", str(self.backend_port),
                                      "--model", MODEL], cwd=repo, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + waited(240)
        while not (up(f"{self.url}/_stcore/health") and up(f"http://127.0.0.1:{self.backend_port}/health")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"launch did not come up; see {self.log.name}")
            time.sleep(0.3)

    def stop(self, keep_cache: bool = False) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if not keep_cache:
            shutil.rmtree(self.cache, ignore_errors=True)


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome = next(p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for f in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1000",
              "--force-device-scale-factor=1", "--disable-background-networking", "--no-first-run",
              f"--user-data-dir={tempfile.mkdtemp(prefix='bench-ui-chrome-')}"):
        opts.add_argument(f)
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    d.set_page_load_timeout(waited(120))
    return d


def css(d: Any, sel: str) -> list:
    from selenium.webdriver.common.by import By

    return d.find_elements(By.CSS_SELECTOR, sel)


def idle(d: Any) -> bool:
    return not css(d, '[data-testid="stStatusWidget"]') and not css(d, '[data-testid="stProgress"]')


def main_text(d: Any) -> str:
    try:
        return css(d, '[data-testid="stMain"]')[0].text
    except (IndexError, Exception):
        return ""


def until(d: Any, cond: Callable[[Any], Any], timeout: float = 300) -> float:
    """Seconds until cond(d) holds (polled every POLL_S)."""
    t0 = time.perf_counter()
    while True:
        try:
            if cond(d):
                return time.perf_counter() - t0
        except Exception:
            pass
        if time.perf_counter() - t0 > waited(timeout):
            raise TimeoutError(f"condition not met in {waited(timeout)} s")
        time.sleep(POLL_S)


def settle(d: Any, timeout: float = 300) -> None:
    """Wait for a run to finish (idle for 0.5 s in a row)."""
    until(d, idle, timeout)
    time.sleep(0.5)
    until(d, idle, timeout)


def button(d: Any, label: str) -> Any:
    from selenium.webdriver.common.by import By

    found = [b for b in d.find_elements(By.XPATH, f"//button[contains(., '{label}')]") if b.is_displayed()]
    if not found:
        raise LookupError(f"no visible button {label!r}")
    return found[0]


def home_run(d: Any, url: str, seed: int) -> float:
    d.get(f"{url}/?{QS}&seed={seed}")  # no task in the link: the first screen waits for Run (the default model's
    # first task, syn-sentiment, is picked)
    until(d, lambda d: button(d, "Run") and idle(d) and "Press Run" in main_text(d), 600)
    settle(d)
    b = button(d, "Run")
    c0 = cpu_by_group()
    t0 = time.perf_counter()
    b.click()
    until(d, lambda d: len(css(d, '[data-testid="stMetric"]')) >= 4 and css(d, ".js-plotly-plot")
          and "Example prompts" in main_text(d) and idle(d), 900)
    took = time.perf_counter() - t0
    CPU[f"home run seed {seed}"] = cpu_delta(c0)
    return took


def toggles(d: Any, url: str, task: str, seed: int) -> list[float]:
    """The first toggles after opening Ablation (a job estimated over ui.jobs.AUTO_START_MAX_S waits for its Run: the
    head scores' Run is pressed first when they are not cached, untimed; the curves' is left alone)."""
    d.get(f"{url}/Ablation?{QS}&task={task}&seed={seed}&kmax=2")

    def ready(d: Any) -> bool:
        text = main_text(d)
        return idle(d) and "Ablation curves" in text and (css(d, ".js-plotly-plot") or "waits for Run" in text)

    until(d, lambda d: idle(d) and ("Ablation curves" in main_text(d) or "waits for Run" in main_text(d)), 900)
    if "Ablation curves" not in main_text(d):  # the head scores wait for Run
        button(d, "Run").click()
    until(d, ready, 900)
    settle(d)
    out = []
    for label in ("Top TR", "Top TL", "Top induction", "Random"):
        before = main_text(d)
        b = button(d, label)
        c0 = cpu_by_group()
        t0 = time.perf_counter()
        b.click()

        def shown(d: Any) -> bool:
            text = main_text(d)
            return "ablation of L" in text and text != before and idle(d) and "Accuracy after" in text

        until(d, shown)
        out.append(time.perf_counter() - t0)
        CPU[f"toggle {label}"] = cpu_delta(c0)
        TOGGLE_ENDS.append(time.time())
        settle(d)
    return out


def ablation_caption(d: Any) -> str:
    return next((c.text for c in css(d, '[data-testid="stCaptionContainer"]') if "ablation of L" in c.text), "")


def toggles_behind_curves(d: Any) -> list[float]:
    """On the Ablation page left by `toggles`: the curves' Run pressed (when they wait for it), then, once they are
    running, toggles timed from the click to their result drawn (the curves' progress bar still running)."""
    if "waits for Run" not in main_text(d):
        return []
    button(d, "Run").click()
    until(d, lambda d: css(d, '[data-testid="stProgress"]') and "Ablation curves:" in main_text(d), 300)
    time.sleep(3)
    out = []
    for label in ("Top TR", "Top TL", "Random"):
        before = ablation_caption(d)
        b = button(d, label)
        t0 = time.perf_counter()
        b.click()
        until(d, lambda d: ablation_caption(d) not in ("", before) and "Accuracy after" in main_text(d), 600)
        out.append(time.perf_counter() - t0)
        time.sleep(3)
    return out


TOGGLE_ENDS: list[float] = []


SHELLS: list[dict[str, float]] = []


def cached_link(d: Any, url: str, path: str, query: str, drawn: Callable[[Any], bool],
                timeout: float = 300) -> tuple[float, float]:
    """(shell, view): seconds from navigation to the page shell, and from the shell to the view drawn and idle.

    The shell is Streamlit's app frame, mounted by its JavaScript (`stAppViewContainer`), before the page's
    script has drawn anything; the HTML's load event (`html_s`) comes earlier still and is recorded too."""
    d.delete_all_cookies()
    c0 = cpu_by_group()
    t0 = time.perf_counter()
    d.get(f"{url}/{path}?{query}")  # returns at the load event
    html = time.perf_counter() - t0
    until(d, lambda d: css(d, '[data-testid="stAppViewContainer"]'), 60)
    shell = time.perf_counter() - t0
    first = until(d, lambda d: css(d, ".js-plotly-plot .main-svg"), timeout)  # the page's first figure drawn
    view = first + until(d, lambda d: drawn(d) and idle(d), timeout)
    CPU[f"cached link {path} #{len(LINK_WINDOWS)}"] = cpu_delta(c0)
    SHELLS.append({"path": path, "html_s": round(html, 3), "shell_s": round(shell, 3),
                   "from_html_s": round(shell - html + view, 3), "first_figure_s": round(first, 3)})
    LINK_WINDOWS.append((path, time.time() - view, time.time()))
    return shell, view


LINK_WINDOWS: list[tuple[str, float, float]] = []


def service_jobs(app: Launch) -> list[dict[str, Any]]:
    """Where the time went on the service: each job's kind, seconds queued and seconds running."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.backend_port}/jobs", timeout=10) as r:
            jobs = json.loads(r.read())
    except OSError:
        return []
    return [{"kind": j["kind"], "status": j["status"], "cache_hit": j.get("cache_hit"),
             "queued_s": round((j.get("started") or j["created"]) - j["created"], 3),
             "ran_s": round((j.get("finished") or 0) - (j.get("started") or 0), 3) if j.get("finished") else None}
            for j in reversed(jobs)]


TRACES: list[dict[str, Any]] = []
CPU: dict[str, dict[str, float]] = {}


def cpu_by_group() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this benchmark's processes: the service, the dashboard
    (Streamlit) and the browser. On a CPU shared with other work, wall time stretches with the load; CPU time
    shows what an interaction costs on its own."""
    import psutil

    out = {"service": 0.0, "dashboard": 0.0, "browser": 0.0}
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd, t = " ".join(p.cmdline()), p.cpu_times()
        except psutil.Error:
            continue
        group = ("service" if " serve " in f"{cmd} " else "dashboard" if "streamlit" in cmd or "ui.warm" in cmd
                 else "browser" if "chrom" in cmd else None)
        if group:
            out[group] += t.user + t.system
    return out


def cpu_delta(before: dict[str, float]) -> dict[str, float]:
    now = cpu_by_group()
    return {k: round(now[k] - before[k], 3) for k in now}


def traced(app: "Launch", what: str, t0: float, t1: float) -> None:
    """Keep the app's service calls between unix times t0 and t1 (HEADLENS_UI_TRACE lines), as offsets."""
    try:
        lines = Path(app.trace).read_text().splitlines()
    except OSError:
        return
    calls = []
    for ln in lines:
        t, name, ms = ln.split(" ")
        if t0 <= float(t) <= t1:
            calls.append(f"+{float(t) - t0:.2f}s {name} {float(ms):.0f}ms")
    TRACES.append({"what": what, "seconds": round(t1 - t0, 3), "calls": calls})


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def first_partial(d: Any, url: str, query: str, timeout: float = 1800) -> dict[str, float]:
    """An anytime Head map (issue 25): a link to a view not computed yet; seconds from the navigation (or from the
    click on Run, when the page waits for it) to the first partial map drawn ("Partial: 4 of 50 prompts"), and to
    the final map."""
    d.get(f"{url}/Head_map?{query}")
    t0 = time.perf_counter()

    def partial_or_run(d: Any) -> bool:
        return "Partial:" in main_text(d) or bool(_visible_run(d))

    until(d, partial_or_run, timeout)
    clicked = False
    run = _visible_run(d)
    if run and "Partial:" not in main_text(d):
        t0, clicked = time.perf_counter(), True
        run[0].click()
    first = until(d, lambda d: "Partial:" in main_text(d) and css(d, ".js-plotly-plot .main-svg"), timeout)
    text = next((x for x in main_text(d).splitlines() if "Partial:" in x), "")
    final = until(d, lambda d: "Top heads" in main_text(d) and "Partial:" not in main_text(d) and idle(d), timeout)
    return {"first_partial_s": round(first, 2), "final_s": round(first + final, 2), "from_run_click": clicked,
            "first_partial_text": text[:80]}


def _visible_run(d: Any) -> list:
    from selenium.webdriver.common.by import By

    return [b for b in d.find_elements(By.XPATH, "//button[normalize-space(.)='Run' or .//p[normalize-space(.)='Run']]")
            if b.is_displayed()]


NET = (50, 20)  # a collaborator's link: 50 Mbit/s each way, 20 ms round trip (Chromium's network emulation)


def fresh_browsers(url: str, path: str, query: str, drawn: Callable[[Any], bool], n: int = 3,
                   net: tuple[float, float] | None = None) -> list[dict[str, float]]:
    """A shared link opened in a new browser each time (a new profile: no HTTP cache, no cookies): seconds from
    the navigation to the page shell, the first figure and the view drawn and idle, and the bytes transferred.
    `net` (Mbit/s, ms): the browser's network emulated at that throughput and round trip (loopback is free)."""
    out = []
    for _ in range(n):
        d = browser()
        try:
            if net:
                d.execute_cdp_cmd("Network.enable", {})
                d.execute_cdp_cmd("Network.emulateNetworkConditions", {
                    "offline": False, "latency": net[1], "downloadThroughput": net[0] * 125_000,
                    "uploadThroughput": net[0] * 125_000})
            c0 = cpu_by_group()
            t0 = time.perf_counter()
            d.get(f"{url}/{path}?{query}")
            until(d, lambda d: css(d, '[data-testid="stAppViewContainer"]'), 120)
            shell = time.perf_counter() - t0
            until(d, lambda d: css(d, ".js-plotly-plot .main-svg"), 300)
            first = time.perf_counter() - t0
            until(d, lambda d: drawn(d) and idle(d), 300)
            view = time.perf_counter() - t0
            CPU[f"fresh browser {path}{' net' if net else ''} #{len(out)}"] = cpu_delta(c0)
            kb = d.execute_script("return performance.getEntriesByType('resource')"
                                  ".reduce((a, e) => a + e.transferSize, 0)") / 1e3
            out.append({"shell_s": round(shell, 3), "first_figure_s": round(first, 3), "view_s": round(view, 3),
                        "transferred_kB": round(kb)})
        finally:
            d.quit()
    return out


def page_switches(d: Any, via: str, path_label: str, drawn: Callable[[Any], bool], n: int = 3) -> list[float]:
    """Seconds from a click on the sidebar's `path_label` link (coming from page `via`) to the view drawn, idle."""
    out = []
    for _ in range(n):
        [e for e in css(d, '[data-testid="stPageLink-NavLink"]') if via in e.text][0].click()
        until(d, lambda d: via in main_text(d)[:200] and idle(d), 300)
        settle(d)
        link = [e for e in css(d, '[data-testid="stPageLink-NavLink"]') if path_label in e.text][0]
        c0 = cpu_by_group()
        t0 = time.perf_counter()
        link.click()
        until(d, lambda d: drawn(d) and idle(d), 300)
        out.append(round(time.perf_counter() - t0, 3))
        CPU[f"page switch to {path_label} #{len(out)}"] = cpu_delta(c0)
    return out


SCENARIOS = ("home", "toggle", "headmap", "steering", "after_launch", "fresh", "partial")


def missing() -> str | None:
    """What this benchmark needs and this machine lacks (Chromium, its driver, Selenium, psutil), or None."""
    import importlib.util

    if not any(map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))):
        return "no chromium"
    if not shutil.which("chromedriver"):
        return "no chromedriver"
    gone = [m for m in ("selenium", "psutil") if importlib.util.find_spec(m) is None]
    return f"no {', '.join(gone)}" if gone else None


def run(repo: Path, label: str, only: tuple[str, ...] = SCENARIOS, smoke: bool = False) -> dict[str, Any]:
    print(f"[{label}] launching from {repo} (load average {load_avg()})", flush=True)
    app = Launch(repo)
    d = browser()
    res: dict[str, Any] = {"label": label, "repo": str(repo), "model": MODEL, "task": TASK, "load_before": load_avg()}
    def scenario(name: str, fn: Callable[[], Any]) -> None:
        try:
            res[name] = fn()
        except Exception as e:  # e.g. an older checkout without the feature: recorded, not fatal
            if smoke:
                raise
            res[name] = None
            shot = Path(tempfile.gettempdir()) / f"bench-ui-{label}-{name}.png"
            d.save_screenshot(str(shot))
            res.setdefault("failed", {})[name] = f"{type(e).__name__}: {e} (screenshot {shot})"[:400]
        print(f"  {name}: {res[name]}", flush=True)

    def steering_links() -> list[tuple[float, float]]:
        sg_q = f"{QS}&task={TASK}&seed=0&sg_vectors=tr,random&sg_layer=2"
        d.get(f"{app.url}/Steering_geometry?{sg_q}")  # computed once, then its link opened in fresh sessions
        until(d, lambda d: idle(d) and "Steering" in main_text(d), 900)
        settle(d, 900)
        if "Zero-shot prompts steered" not in d.page_source:
            button(d, "Run").click()
            until(d, lambda d: "Zero-shot prompts steered" in d.page_source and idle(d), 900)
        return [cached_link(d, app.url, "Steering_geometry", sg_q, lambda d: "Zero-shot prompts steered" in
                            d.page_source, timeout=60) for _ in range(3)]

    hm_q = f"{QS}&task={TASK}&seed=0&kmax=16&top_pct=3"

    def hm_drawn(d: Any) -> bool:
        return len(css(d, ".js-plotly-plot")) >= 2 and "Top heads" in main_text(d)

    def computed_head_map() -> None:
        """The Head map of hm_q drawn in `d`: found cached, or computed (its Run pressed where the scores wait for
        it: a real model's are estimated over the pages' 15 s auto-start limit)."""
        d.get(f"{app.url}/Head_map?{hm_q}")
        until(d, lambda d: (hm_drawn(d) or _visible_run(d)) and idle(d), 900)
        if not hm_drawn(d):
            _visible_run(d)[0].click()
        until(d, lambda d: hm_drawn(d) and idle(d), 1800)
        settle(d, 900)

    def head_map_links() -> list[tuple[float, float]]:
        computed_head_map()  # computed once (or found), then its link opened in fresh sessions
        return [cached_link(d, app.url, "Head_map", hm_q, hm_drawn) for _ in range(3)]

    def after_launch() -> list[dict[str, float]]:
        """The Head map link opened right after a new launch on the same cache: fresh service and dashboard."""
        nonlocal app
        computed_head_map()
        out = []
        for _ in range(2):
            cache, ports = app.cache, (app.port, app.backend_port)
            app.stop(keep_cache=True)
            app = Launch(repo, cache=cache, ports=ports)  # the same URL: the browser's cache holds the app's files
            d.delete_all_cookies()
            c0 = cpu_by_group()
            t0 = time.perf_counter()
            d.get(f"{app.url}/Head_map?{hm_q}")
            first = until(d, lambda d: css(d, ".js-plotly-plot .main-svg"), 300)
            view = until(d, lambda d: hm_drawn(d) and idle(d), 300) + first
            took = time.perf_counter() - t0
            CPU[f"after launch #{len(out)}"] = cpu_delta(c0)
            traced(app, f"after launch #{len(out)}", time.time() - took, time.time())
            out.append({"first_figure_s": round(took - (view - first), 3), "view_s": round(took, 3)})
        return out

    def fresh() -> dict[str, Any]:
        """A page switch in a session against the same cached link in a new browser (issue 25)."""
        computed_head_map()
        return {"page_switch_s": page_switches(d, "Sweeps", "Head map", hm_drawn),
                "fresh_browser": fresh_browsers(app.url, "Head_map", hm_q, hm_drawn),
                "fresh_browser_net": fresh_browsers(app.url, "Head_map", hm_q, hm_drawn, n=2, net=NET),
                "load": load_avg()}

    def partial() -> dict[str, Any]:
        return first_partial(d, app.url, f"{QS}&task={TASK}&seed=11")

    def homes() -> list[float]:
        out = []
        for seed in (0,) if smoke else (0, 1, 2):
            out.append(home_run(d, app.url, seed))
            traced(app, f"home run seed {seed}", time.time() - out[-1], time.time())
        return out

    def toggled() -> list[float]:
        t = toggles(d, app.url, TASK, 0)
        for i, (label, x) in enumerate(zip(("Top TR", "Top TL", "Top induction", "Random"), t)):
            end = TOGGLE_ENDS[i]
            traced(app, f"toggle {label}", end - x, end)
        return t

    def toggled_behind_curves() -> list[float]:
        return toggles_behind_curves(d)

    try:
        if "home" in only:
            scenario("home_run_s", homes)
        if "toggle" in only:
            scenario("toggle_s", toggled)
            scenario("toggle_behind_curves_s", toggled_behind_curves)
        if "headmap" in only:
            scenario("link_head_map_s", head_map_links)
        if "steering" in only:
            scenario("link_steering_s", steering_links)
        for path, a, b in LINK_WINDOWS:
            traced(app, f"cached link {path}", a, b)
        if "fresh" in only:
            scenario("fresh", fresh)
        if "partial" in only:
            scenario("partial", partial)
        if "after_launch" in only:
            scenario("after_launch", after_launch)
        res["service_jobs"] = service_jobs(app)
        res["traces"] = TRACES
        res["cpu_s"] = CPU
        res["shells"] = SHELLS
    finally:
        res["load_after"] = load_avg()
        d.quit()
        app.stop()
    return res


def summary(res: dict[str, Any]) -> dict[str, float | None]:
    med = statistics.median
    home, tog, behind = res.get("home_run_s"), res.get("toggle_s"), res.get("toggle_behind_curves_s")
    hm, sg = res.get("link_head_map_s"), res.get("link_steering_s")
    firsts = [x["first_figure_s"] for x in res.get("shells") or [] if x["path"] == "Head_map" and "first_figure_s" in x]
    after = res.get("after_launch")
    fr, part = res.get("fresh") or {}, res.get("partial") or {}
    return {"home_first": home[0] if home else None, "home_median": med(home) if home else None,
            "toggle_first": tog[0] if tog else None,
            "toggle_median": med(tog) if tog else None, "toggle_max": max(tog) if tog else None,
            "toggle_behind_curves_max": max(behind) if behind else None,
            "head_map_shell": med(s for s, _ in hm) if hm else None,
            "head_map_first_figure": med(firsts) if firsts and hm else None,
            "head_map_view": med(v for _, v in hm) if hm else None,
            "steering_view": med(v for _, v in sg) if sg else None,
            "after_launch_first_figure": med(x["first_figure_s"] for x in after) if after else None,
            "after_launch_view": med(x["view_s"] for x in after) if after else None,
            "page_switch": med(fr["page_switch_s"]) if fr.get("page_switch_s") else None,
            "fresh_browser_view": med(x["view_s"] for x in fr["fresh_browser"]) if fr.get("fresh_browser") else None,
            "fresh_over_switch": (round(med(x["view_s"] for x in fr["fresh_browser"]) / med(fr["page_switch_s"]), 2)
                                  if fr.get("fresh_browser") and fr.get("page_switch_s") else None),
            "fresh_browser_net_view": (med(x["view_s"] for x in fr["fresh_browser_net"])
                                       if fr.get("fresh_browser_net") else None),
            "first_partial": part.get("first_partial_s"), "partial_final": part.get("final_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=str(REPO), help="the checkout to launch (default: this one)")
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--model", default="default", help="the model to measure on: `default` (syn-sentiment) or a "
                                                       "pulled preset such as smollm2-135m (sentiment)")
    ap.add_argument("--realtime", action="store_true",
                    help="run under SCHED_RR priority 1 (root only): on a machine busy with other work, the closest "
                         "to 'nothing else running' (other processes then wait: keep the run short)")
    ap.add_argument("--smoke", action="store_true", help="one first Home run; any failure is an error (seconds)")
    ap.add_argument("--nice", type=int, default=0,
                    help="change this process's niceness first (its servers and the browser inherit it); a negative "
                         "value (root only) approximates 'nothing else running' on a CPU shared with other work")
    a = ap.parse_args()
    if a.smoke:
        why = missing()
        if why:
            print(f"smoke: skipped ({why})")
            return
        a.only = "home"
        smoke_waits()
    if a.nice:
        try:
            os.nice(a.nice)
        except OSError as e:
            print(f"--nice {a.nice}: {e}; measuring at the default priority", file=sys.stderr)
    if a.realtime:
        try:  # inherited by the servers and the browser; the kernel keeps 5% of the CPU for everything else
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except (OSError, AttributeError) as e:
            print(f"--realtime: {e}; measuring at the default priority", file=sys.stderr)
    use_model(a.model)
    res = run(Path(a.repo).resolve(), a.label, tuple(a.only.split(",")), smoke=a.smoke)
    res["nice"] = os.nice(0)
    res["scheduler"] = "SCHED_RR 1" if os.sched_getscheduler(0) == os.SCHED_RR else "default"
    res["summary"] = summary(res)
    print(json.dumps(res["summary"], indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
