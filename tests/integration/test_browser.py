"""The real thing in a real browser: `python -m backend launch` (service + dashboard, on free localhost ports)
driven by headless Chromium through Selenium.

It runs a task on the default model from the Home page's Run button, opens the Head map through the sidebar,
checks the heatmap is drawn (plotly's SVG heatmap layer and the grid of head markers), clicks a cell to
select a head, opens the Ablation page with that head switched off, and saves screenshots under
tests/artifacts/. Ctrl-C (SIGINT) to the launcher must stop both servers.

Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them); skips cleanly without them.
HEADLENS_UI_TEST_MODEL runs it against another model folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hang import HANG_S, wait_until

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
MODEL = os.environ.get("HEADLENS_UI_TEST_MODEL", "default")
SERVICE: dict[str, str] = {}  # the launched service's URL (the app_url fixture fills it)
LAUNCH: dict[str, subprocess.Popen] = {}  # the launcher, for the test that stops it (the module's last)
CHROME_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1440,2000", "--force-device-scale-factor=1"]


def _browser() -> tuple[str, str]:
    chrome = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("headless browser test needs Debian's `chromium` and `chromium-driver` "
                    "(apt-get install -y chromium chromium-driver; .ci/run installs them)")
    return chrome, driver


def _model_present() -> bool:
    if MODEL != "default":
        return Path(MODEL).is_dir()
    return (REPO / "models" / "headlens-tiny" / "config.json").is_file()


def _shape() -> tuple[int, int]:
    """(layers, heads) of the test model, from its config.json."""
    folder = REPO / "models" / "headlens-tiny" if MODEL == "default" else Path(MODEL)
    cfg = json.loads((folder / "config.json").read_text())
    return int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    """Whether a server answers 200 there (False at once when nothing listens: refused)."""
    try:
        with urllib.request.urlopen(url, timeout=HANG_S) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """`python -m backend launch` on free ports; yields the dashboard URL; stops it with SIGINT."""
    if not _model_present():
        pytest.skip(f"model {MODEL!r} is absent (models/headlens-tiny comes from `python -m backend train-default`)")
    _browser()
    pytest.importorskip("selenium")
    port, backend_port = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("launch") / "launch.log"
    env = dict(os.environ, HEADLENS_CACHE_DIR=str(tmp_path_factory.mktemp("browser-cache")), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", HEADLENS_LOG=str(log.parent / "servers.log"),
               HEADLENS_LAUNCH_TIMEOUT=str(HANG_S))  # the launcher waits for its servers as long as it takes
    for var in ("HEADLENS_BACKEND_URL", "HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT"):
        env.pop(var, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "backend", "launch", "--no-browser", "--host", "127.0.0.1",
                                 "--port", str(port), "--backend-port", str(backend_port), "--model", MODEL],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_S
        while not (log.read_text(errors="replace").find("headlens is running") >= 0 and _up(f"{url}/_stcore/health")):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"launch did not come up (status {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        wait_until(lambda: _up(f"http://127.0.0.1:{backend_port}/health"), "the service answering /health")
        SERVICE["url"] = f"http://127.0.0.1:{backend_port}"
        LAUNCH["proc"] = proc
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            try:
                proc.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"launch did not stop on SIGINT within {HANG_S:g} s (the hang guard)")
    text = log.read_text(errors="replace")
    assert "stopped." in text, text[-2000:]
    assert not _up(f"{url}/_stcore/health") and not _up(f"http://127.0.0.1:{backend_port}/health")


@pytest.fixture
def driver(tmp_path):
    chrome, chromedriver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for f in CHROME_FLAGS + [f"--user-data-dir={tmp_path / 'chrome-profile'}"]:
        opts.add_argument(f)
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_page_load_timeout(HANG_S)
    yield d
    d.quit()


def _wait(d, what, timeout: float = HANG_S):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # an element read while Streamlit redraws it goes stale: read it again at the next poll
    return WebDriverWait(d, timeout, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: what(d))


def _css(d, sel: str):
    from selenium.webdriver.common.by import By

    return d.find_elements(By.CSS_SELECTOR, sel)


def _no_errors(d) -> None:
    assert not _css(d, '[data-testid="stException"]'), "a traceback is shown"
    errs = [e.text for e in _css(d, '[data-testid="stAlertContentError"]')]
    assert not errs, errs


def _selected_tags(d) -> list[str]:
    return [e.get_attribute("aria-label") for e in
            _css(d, '[data-testid="stMultiSelect"] .react-aria-ComboBox [data-tag]')]


def _idle(d) -> bool:
    """Streamlit finished the run: no 'running' status widget and no progress bar."""
    return not _css(d, '[data-testid="stStatusWidget"]') and not _css(d, '[data-testid="stProgress"]')


def test_dashboard_in_headless_chromium(app_url, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    d = driver
    # Home: the first screen, then Run
    d.get(f"{app_url}/?model={MODEL}&shots=4&prompts=16&seed=0")
    run = _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Run')]")
                              if b.is_displayed()])[0]
    task = _wait(d, lambda d: "task=" in d.current_url and d.current_url.split("task=")[1].split("&")[0])
    run.click()
    _wait(d, lambda d: len(_css(d, '[data-testid="stMetric"]')) >= 4 and _css(d, ".js-plotly-plot") and _idle(d))
    _no_errors(d)
    labels = " ".join(e.text for e in _css(d, '[data-testid="stMetric"]'))
    assert "Accuracy (4-shot)" in labels and "Label accuracy (4-shot)" in labels and "TR ratio (4-shot)" in labels
    time.sleep(1.0)
    d.save_screenshot(str(ARTIFACTS / "home.png"))
    # the sidebar's HTML and the pages' CSS (st.html): the brand styled, the share link to this view, same tab
    brand = _css(d, '[data-testid="stSidebar"] .hl-brand')[0]
    assert brand.text == "headlens" and brand.value_of_css_property("font-weight") == "700"
    link = _css(d, '[data-testid="stSidebar"] .hl-link a')[0]
    assert f"task={task}" in link.get_attribute("href") and link.get_attribute("target") in (None, "", "_self")

    # Head map through the sidebar link: the state travels in the URL
    _wait(d, lambda d: _css(d, '[data-testid="stSidebar"] a[href*="Head_map"]'))[0].click()
    n_layers, n_heads = _shape()
    grid = ".js-plotly-plot .scatterlayer .trace:first-child .point"
    # drawn: the big map and the five small ones as heatmap images, a marker per head, three figures in all
    _wait(d, lambda d: _css(d, ".js-plotly-plot .heatmaplayer image") and len(_css(d, ".js-plotly-plot")) >= 2
          and _idle(d))
    toggle = [e for e in _css(d, '[data-testid="stCheckbox"]') if "All five maps" in e.text][0]
    toggle.find_element(By.CSS_SELECTOR, "label").click()  # all five maps, each with its colour bar
    _wait(d, lambda d: len(_css(d, ".js-plotly-plot .heatmaplayer image")) >= 6 and len(_css(d, ".js-plotly-plot")) >= 3
          and len(_css(d, ".js-plotly-plot .colorbar")) >= 6 and _idle(d))
    assert f"task={task}" in d.current_url
    first = _css(d, ".js-plotly-plot")[0]
    assert first.find_elements(By.CSS_SELECTOR, ".heatmaplayer image"), "the heatmap image is not drawn"
    n_cells = len(first.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace:first-child .point"))
    assert n_cells == n_layers * n_heads, f"expected a marker per head ({n_layers} x {n_heads}), found {n_cells}"
    assert len(_css(d, grid)) >= n_cells
    _no_errors(d)
    assert _selected_tags(d) == []
    # issue 36: the caption counts the outlined top heads that are significant; a p at the null's floor is a bound
    assert re.search(r"\d+ of the top \d+ are significant \(q ≤ 0.05\)", _text(d)), _text(d)[:1500]
    hover = d.execute_script("return JSON.stringify(document.querySelectorAll('.js-plotly-plot')[0].data"
                             ".map(t => t.customdata || []))")
    assert "p ≤ 0.001 (1,000 draws)" in hover and "p = 0.000999" not in hover
    outlined = sorted(d.execute_script(  # the map's top heads (pink outline), for the Ablation page's quick pick
        "const t = document.querySelectorAll('.js-plotly-plot')[0]._fullData.find(t => (t.name || '').startsWith('top'));"
        "return Array.from(t.x).map((h, i) => 'L' + t.y[i] + '.H' + h);"))

    # Click the cell of layer 1, head 2 of the big map (layer 0 is the top row): it becomes the selection
    layer, head = min(1, n_layers - 1), min(2, n_heads - 1)
    name = f"L{layer}.H{head}"
    drag = first.find_element(By.CSS_SELECTOR, ".nsewdrag")
    r = drag.rect
    dx = int(r["width"] * ((head + 0.5) / n_heads - 0.5))
    dy = int(r["height"] * ((layer + 0.5) / n_layers - 0.5))
    ActionChains(d).move_to_element_with_offset(drag, dx, dy).click().perform()
    _wait(d, lambda d: _selected_tags(d) == [name])
    _wait(d, lambda d: f"heads={layer}.{head}" in d.current_url and _idle(d))
    # the clicked head's drill-down: its attention pattern as a token view, live on hover
    _wait(d, lambda d: len(_css(d, ".hl-tv .hl-tok")) > 3 and _idle(d))
    toks = _css(d, ".hl-tv .hl-tok")
    assert "attention from the last token" in toks[1].get_attribute("title")
    ActionChains(d).move_to_element(toks[3]).perform()  # hover another destination token
    _wait(d, lambda d: '(token 3)' in _css(d, ".hl-tv .hl-tok")[1].get_attribute("title"))
    assert _css(d, ".hl-tv .hl-tok")[3].get_attribute("class").endswith("hl-dest")
    time.sleep(1.5)  # let plotly finish drawing the selection outline
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "headmap.png"))

    # Ablation: the clicked head is switched off at once
    _css(d, '[data-testid="stSidebar"] a[href*="Ablation"]')[0].click()
    _wait(d, lambda d: "Ablation" in d.current_url and _selected_tags(d) == [name])
    _wait(d, lambda d: len(_css(d, '[data-testid="stDataFrame"]')) >= 2 and _css(d, ".js-plotly-plot") and _idle(d))
    _no_errors(d)
    text = d.find_element(By.CSS_SELECTOR, '[data-testid="stMain"]').text
    assert "Accuracy after" in text and f"zero ablation of {name}" in text
    # issue 36: the curves say where they ablate, beside the switch's own default
    assert "ablation at every position of the k heads" in text and "(the switch above ablates at the last token)" in text
    time.sleep(1.0)
    d.save_screenshot(str(ARTIFACTS / "ablation.png"))
    # issue 36: Top TR selects the top set the map outlines (the sidebar's Top heads), not 3 heads
    _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Top TR')]") if b.is_displayed()])[0].click()
    _wait(d, lambda d: sorted(_selected_tags(d)) == outlined and _idle(d))
    assert len(outlined) != 3


def _text(d) -> str:
    from selenium.webdriver.common.by import By

    return d.find_element(By.CSS_SELECTOR, '[data-testid="stMain"]').text


def _service_jobs() -> list[dict]:
    with urllib.request.urlopen(f"{SERVICE['url']}/jobs", timeout=HANG_S) as r:
        return json.loads(r.read())


def test_upload_with_unknown_words_shows_the_fit_check(app_url, driver, tmp_path):
    from selenium.webdriver.common.by import By

    d = driver
    d.get(f"{app_url}/?model={MODEL}&shots=4&prompts=16&seed=0")
    _wait(d, lambda d: [e for e in d.find_elements(By.XPATH, "//*[contains(text(), 'Bring your own task')]")])[0].click()
    words = "great awful lovely boring superb dull charming tedious brilliant weak fine poor".split()
    f = tmp_path / "english.csv"
    f.write_text("input,output\n" + "".join(f"{w} {n},{'pos' if i % 2 else 'neg'}\n"
                                           for i, (w, n) in enumerate((w, n) for n in ("film", "play") for w in words)))
    _wait(d, lambda d: _css(d, 'input[type="file"]'))[0].send_keys(str(f))
    _wait(d, lambda d: "does not fit model" in _text(d) and _idle(d))
    text = _text(d)
    assert "english" in text and "100% of the input tokens" in text and "unknown token" in text
    assert not _css(d, '[data-testid="stException"]')
    d.save_screenshot(str(ARTIFACTS / "upload-fit.png"))


def test_a_steering_link_reopens_settings_and_cached_result(app_url, driver):
    d = driver
    q = (f"model={MODEL}&task=syn-sentiment&shots=4&prompts=16&seed=0&sg_vectors=tl,random&sg_layer=1&"
         f"sg_alpha=2.5&sg_pca_layer=0&sg_final_norm=0&sg_perturbations=shuffled_inputs")
    d.get(f"{app_url}/Steering_geometry?{q}")
    _wait(d, lambda d: "Press **Run**" not in _text(d) and _run_buttons(d) and _idle(d))
    _wait(d, _click_first_run)  # the steering section's Run (retried while Streamlit redraws it)
    _wait(d, lambda d: "Zero-shot prompts steered at layer 1" in d.page_source and _idle(d))
    _no_errors(d)
    link = d.current_url
    for part in ("sg_vectors=tl%2Crandom", "sg_layer=1", "sg_alpha=2.5", "sg_final_norm=0", "sg_pca_layer=0"):
        assert part in link or part.replace("%2C", ",") in link, (part, link)
    d.delete_all_cookies()
    jobs = {j["id"] for j in _service_jobs()}
    d.get(link)  # a fresh session from the link: same settings, the cached result without a click
    _wait(d, lambda d: "Zero-shot prompts steered at layer 1" in d.page_source and _idle(d))
    assert {j["id"] for j in _service_jobs()} == jobs  # shown from the cache: no new job ran for it
    tags = [e.text for e in _css(d, '[data-testid="stMultiSelect"] [data-tag]')]
    assert "TL vector" in " ".join(tags) and "random-heads vector" in " ".join(tags)
    assert "2.50" in [e.get_attribute("value") for e in _css(d, 'input[type="number"]')]
    assert "2 vector types at layer 1, α = 2.5" in _text(d)
    boxes = " ".join((e.get_attribute("value") or "") + " " + e.text for e in
                     _css(d, '[data-testid="stSelectbox"] input, [data-testid="stSelectbox"] [value]'))
    assert "after layer 0" in boxes or "after layer 0" in d.page_source
    assert _text(d).count("Press Run") == 2  # geometry and perturbations: not cached, they wait for Run
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "steering-link.png"))


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> str:
    """A random-weight Llama with the default model's tokenizer (so its tasks fit) that is big enough for a
    steering sweep to run for many seconds: a job to cancel (the default model finishes any job in about a second)."""
    if MODEL != "default":
        pytest.skip("the slow model borrows the default model's tokenizer")
    import torch
    import transformers as T

    folder = tmp_path_factory.mktemp("slow-llama")
    src = REPO / "models" / "headlens-tiny"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, folder / f)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8, hidden_size=512,
                        intermediate_size=2048, vocab_size=vocab, max_position_embeddings=64, bos_token_id=1,
                        eos_token_id=2, pad_token_id=0)
    T.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return str(folder)


def test_cancel_cancels_a_running_job(app_url, driver, slow_model):
    from selenium.webdriver.common.by import By

    d = driver
    d.get(f"{app_url}/Steering_geometry?model={slow_model}&task=syn-antonym&shots=8&prompts=40&seed=3&"
          f"sg_vectors=fv,vanilla&sg_layer=all")
    _wait(d, lambda d: "Press Run" in _text(d) and _idle(d))
    d.save_screenshot(str(ARTIFACTS / "before-cancel.png"))
    _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Run')]")
                        if b.is_displayed()])[0].click()
    cancel = _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Cancel')]")
                                 if b.is_displayed()])[0]
    _wait(d, lambda d: any("%" in e.text for e in _css(d, '[data-testid="stProgress"]')))
    d.save_screenshot(str(ARTIFACTS / "running.png"))
    cancel.click()
    _wait(d, lambda d: "was cancelled" in _text(d))
    steer = [j for j in _service_jobs() if j["kind"] == "steer" and j["params"].get("model") == slow_model]
    assert steer and steer[0]["status"] in ("cancelled", "cancelling") or steer[0]["message"] == "cancelling", steer[:1]
    _wait(d, lambda d: [j for j in _service_jobs() if j["id"] == steer[0]["id"]][0]["status"] == "cancelled")
    assert [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Run again')]") if b.is_displayed()]
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "cancelled.png"))


def test_home_runs_on_smollm2(app_url, driver):
    """One page on the real SmolLM2-135M (the `smollm2-135m` preset; skipped when it is not pulled): the model box
    offers it, and the Home page's Run gives accuracies at 4 shots."""
    from selenium.webdriver.common.by import By

    from backend.weights import presets

    if not presets.is_pulled("smollm2-135m"):
        pytest.skip(f"smollm2-135m is not pulled: {presets.pull_command('smollm2-135m')}")
    d = driver
    d.get(f"{app_url}/?model=smollm2-135m&task=present-past&shots=4&prompts=8&seed=0")
    run = _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Run')]")
                              if b.is_displayed()])[0]
    boxes = " ".join((e.get_attribute("value") or "") + " " + (e.get_attribute("aria-label") or "") + " " + e.text
                     for e in _css(d, '[data-testid="stSidebar"] [data-testid="stSelectbox"], '
                                      '[data-testid="stSidebar"] [data-testid="stSelectbox"] *'))
    assert "smollm2-135m" in boxes, boxes[:600]
    run.click()
    _wait(d, lambda d: len(_css(d, '[data-testid="stMetric"]')) >= 4 and _idle(d))
    _no_errors(d)
    labels = " ".join(e.text for e in _css(d, '[data-testid="stMetric"]'))
    assert "Accuracy (4-shot)" in labels and "TR ratio (4-shot)" in labels
    d.save_screenshot(str(ARTIFACTS / "home-smollm2.png"))


# -- issue 19: the defects a walk through the dashboard found ------------------------------------------------------
def _post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{SERVICE['url']}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        return json.loads(r.read())


def _run_buttons(d) -> list:
    from selenium.webdriver.common.by import By

    return [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Run')]") if b.is_displayed()]


def _click_first_run(d) -> bool:
    """Click the first displayed Run button; False (to be retried) while none is shown or it is redrawn."""
    from selenium.common.exceptions import StaleElementReferenceException, ElementNotInteractableException

    try:
        runs = _run_buttons(d)
        if not runs:
            return False
        runs[0].click()
        return True
    except (StaleElementReferenceException, ElementNotInteractableException):
        return False


def _tick_texts(d, chart_key: str) -> list[str]:
    """The x tick labels of the plotly chart with Streamlit key `chart_key`."""
    return d.execute_script(
        "const el = document.querySelector('.st-key-' + arguments[0]);"
        "return el ? [...el.querySelectorAll('.xtick text')].map(t => t.textContent) : null;", chart_key) or []


def test_a_first_soft_head_selection_run_with_its_budget_curve_shows_its_result(app_url, driver):
    """Defect 1: the first (uncached) SITE run crashed with StreamlitDuplicateElementKey (`site_live_{step}`, the step
    restarting for each budget run) and left the bar at 80% with a dead Cancel."""
    d = driver
    d.get(f"{app_url}/Soft_head_selection?model={MODEL}&task=syn-sentiment&prompts=6&seed=5&site_m=4&site_shots=2&"
          f"site_steps=200")
    _wait(d, lambda d: "Press **Run** to train" not in d.page_source and _run_buttons(d) and _idle(d))
    _run_buttons(d)[0].click()
    _wait(d, lambda d: _css(d, '[data-testid="stException"]') or (len(_css(d, ".js-plotly-plot")) >= 4 and _idle(d)))
    _no_errors(d)
    assert "DuplicateElementKey" not in d.page_source
    assert [t for t in _tick_texts(d, "site_budget") if t.strip()] == ["1", "5", "10", "50"]
    assert "α per head" in d.page_source and not _css(d, '[data-testid="stProgress"]')
    d.save_screenshot(str(ARTIFACTS / "site-first-run.png"))


def test_the_whole_attention_pattern_is_drawn_full_size_with_its_tokens(app_url, driver):
    """Defect 3: the pattern heatmap was squashed into a ~64 px strip, and the `<s>` token label was missing (plotly
    read it as a strikethrough tag)."""
    from selenium.webdriver.common.by import By

    d = driver
    d.get(f"{app_url}/Head?model={MODEL}&task=syn-sentiment&shots=4&prompts=16&seed=0&head=1.2")
    _wait(d, lambda d: len(_css(d, ".hl-tv .hl-tok")) > 3 and _idle(d))
    _wait(d, lambda d: _tick_texts(d, "head_page_att"))  # plotly draws after Streamlit is idle (a race seen once)
    assert "<s>" in _tick_texts(d, "head_page_att"), _tick_texts(d, "head_page_att")  # the bar chart's token labels
    label = "//label[contains(., 'whole attention pattern')]"
    _wait(d, lambda d: d.find_elements(By.XPATH, label))  # drawn below the bar chart, a moment later on a busy machine
    toggle = d.find_elements(By.XPATH, label)[0]
    toggle.click()
    _wait(d, lambda d: _tick_texts(d, "head_page_pattern") and _idle(d))
    ticks = _tick_texts(d, "head_page_pattern")
    assert ticks[0] == "<s>", ticks
    width = d.execute_script("return document.querySelector('.st-key-head_page_pattern .nsewdrag')"
                             ".getBoundingClientRect().width;")
    assert width > 400, width  # the plot area spans the page, not a strip
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "attention-pattern.png"))


def test_the_sweeps_list_follows_a_running_sweep_to_its_end(app_url, driver):
    """Defect 4: the list said "running · 18%" while the sweep's detail line said "done · 15 of 15", until a reload."""
    d = driver
    sw = _post("/sweeps", {"models": [MODEL], "tasks": ["syn-sentiment", "syn-antonym", "syn-size"],
                           "kinds": ["scores", "icl", "ablation_curves"], "seeds": [21, 22, 23],
                           "params": {"shots": 4, "prompts": 16, "icl.shots": [0, 2, 4]}})
    n = sw["counts"]["total"]
    d.get(f"{app_url}/Sweeps?model={MODEL}&sweep={sw['id']}&seed=3")

    def picker(d) -> str:  # the sweep picker's text: "<id> · running · 27 jobs", from the same poll as the table
        return " ".join(v for v in (e.get_attribute("value") or "" for e in _css(d, '[data-testid="stSelectbox"] input'))
                        if sw["id"] in v)

    _wait(d, lambda d: sw["id"] in picker(d))
    saw_running = "running" in picker(d)
    _wait(d, lambda d: f"of {n} jobs" in _text(d) and f"{n} of {n} jobs" in _text(d))
    _wait(d, lambda d: "· done ·" in picker(d))  # the list follows, without a reload
    text = _text(d)
    assert f"done · {n} of {n} jobs" in text and "running ·" not in picker(d)
    # issue 36: a finished sweep keeps no progress bar; a new one starts on the sidebar's seed (3), not 0
    _wait(d, lambda d: not _css(d, '[data-testid="stProgress"]'))
    assert [e.get_attribute("value") for e in _css(d, 'input[aria-label="Seeds"]')] == ["3"]
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "sweeps-done.png"))
    assert saw_running or sw["status"] == "running"  # the page was opened while it ran


def test_soft_head_selection_finds_an_ltv_trained_without_the_mechanism(app_url, driver):
    """Defect 8: SITE's LTV baseline (and the all-methods view) found an `ltv` result only when every other
    parameter was a default: after `ltv --no-mechanism --perturbations 128` it said there was none."""
    d = driver
    job = _post("/jobs", {"kind": "ltv", "model": MODEL, "task": "syn-sentiment", "prompts": 6, "seed": 9,
                          "mechanism": False, "perturbations": 128, "epochs": 2, "train_prompts": 8})
    deadline = time.monotonic() + HANG_S
    while True:
        with urllib.request.urlopen(f"{SERVICE['url']}/jobs/{job['id']}", timeout=HANG_S) as r:
            j = json.loads(r.read())
        if j["status"] not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, j
        time.sleep(0.5)
    assert j["status"] == "done", j.get("error")
    d.get(f"{app_url}/Soft_head_selection?model={MODEL}&task=syn-sentiment&prompts=6&seed=9&site_m=4&site_shots=2&"
          f"site_steps=20")
    _wait(d, lambda d: _run_buttons(d) and _idle(d))
    _run_buttons(d)[0].click()
    _wait(d, lambda d: _tick_texts(d, "site_bars") and _idle(d))
    assert "LTV" in _tick_texts(d, "site_bars"), _tick_texts(d, "site_bars")
    assert "no cached LTV result" not in d.page_source
    _run_buttons(d)[-1].click()  # every steering method
    _wait(d, lambda d: _tick_texts(d, "site_methods_bars") and _idle(d))
    assert "LTV" in _tick_texts(d, "site_methods_bars")
    assert "Train an LTV on the Learned task vectors page" not in _text(d)  # it asked although one was cached
    _no_errors(d)
    d.save_screenshot(str(ARTIFACTS / "site-ltv-baseline.png"))


def test_links_open_on_the_models_defaults_and_ignore_what_lies_beyond_it(app_url, driver):
    """Issue 36: a link naming only the model opened on antonym, kmax=16, top_pct=3 (the sidebar said present-past,
    top 27, k = 27); `head=99.99` showed another head without a word."""
    d = driver
    d.get(f"{app_url}/Head_map?model=smollm2-135m")
    _wait(d, lambda d: "task=" in d.current_url and "kmax=" in d.current_url)
    for part in ("model=smollm2-135m", "task=present-past", "shots=8", "kmax=27", "top_k=27"):
        assert part in d.current_url, (part, d.current_url)
    d.get(f"{app_url}/Head?model={MODEL}&task=syn-sentiment&shots=4&prompts=16&seed=0&head=99.99")
    _wait(d, lambda d: len(_css(d, ".hl-tv .hl-tok")) > 3 and _idle(d))
    assert "head=99.99" in d.page_source and "beyond the model" in d.page_source
    assert "head=99.99" not in d.current_url  # the default head instead: the top TR head
    _no_errors(d)


def test_on_a_phone_the_sidebar_starts_collapsed(app_url, driver):
    """Defect 9: the sidebar opened expanded and covered 75% of a 390 px screen."""
    d = driver
    d.set_window_size(390, 844)
    d.get(f"{app_url}/?model={MODEL}&task=syn-sentiment")
    _wait(d, lambda d: _css(d, '[data-testid="stSidebar"]') and _idle(d))
    side = _css(d, '[data-testid="stSidebar"]')[0]
    assert side.get_attribute("aria-expanded") == "false" or side.rect["x"] + side.rect["width"] <= 10, side.rect
    main = _css(d, '[data-testid="stMain"]')[0]
    assert main.rect["width"] >= 350
    d.save_screenshot(str(ARTIFACTS / "phone.png"))


# -- the module's LAST test: it stops the launch ----------------------------------------------------------------------
def test_share_as_html_opens_with_the_service_stopped(app_url, driver, tmp_path):
    """Share as HTML: the Head map's file, downloaded from the sidebar, then opened from disk after the launch (service
    and dashboard) has stopped: its figures draw (plotly inlined), its settings and CLI command are there, and the
    browser fetched nothing over the network. Stops the launch, so it runs last in this module."""
    from selenium.webdriver.common.by import By

    d = driver
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    d.get(f"{app_url}/Head_map?model={MODEL}&task=syn-sentiment&shots=4&prompts=16&seed=0&all_maps=1&cscale=rank")
    _wait(d, lambda d: len(_css(d, ".js-plotly-plot")) >= 3 and _idle(d))
    n_figures = len(_css(d, ".js-plotly-plot"))
    button = _wait(d, lambda d: [b for b in d.find_elements(By.XPATH, "//button[contains(., 'Share as HTML')]")
                                 if b.is_displayed()])[0]
    button.click()
    files = _wait(d, lambda d: [f for f in tmp_path.glob("*.html")])
    path = files[0]
    _wait(d, lambda d: not list(tmp_path.glob("*.crdownload")) and path.stat().st_size > 3_000_000)
    assert path.name.startswith(f"headlens_Head-map_{MODEL}_syn-sentiment_4shot"), path.name
    proc = LAUNCH["proc"]
    proc.send_signal(signal.SIGINT)  # the service and the dashboard stop
    proc.wait(timeout=HANG_S)
    assert not _up(f"{app_url}/_stcore/health") and not _up(f"{SERVICE['url']}/health")
    d.get(path.as_uri())
    _wait(d, lambda d: len(_css(d, ".js-plotly-plot .main-svg")) >= n_figures)
    assert len(_css(d, ".js-plotly-plot .heatmaplayer image")) >= 6  # the map and the five small ones
    text = d.find_element(By.TAG_NAME, "body").text
    assert f"python -m backend head-scores --model {MODEL} --task syn-sentiment --shots 4 --prompts 16 --seed 0" in text
    assert "Settings" in text and "syn-sentiment" in text and "Top 10 heads by TR" in text
    assert "colour scale rank" in text and "cscale=rank" in d.page_source  # issue 36: kept in the link and the file
    assert "rank 1" in " ".join(e.text for e in _css(d, ".js-plotly-plot .colorbar"))  # drawn on the rank scale
    urls = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert not [u for u in urls if u.startswith(("http:", "https:"))], urls  # nothing fetched from anywhere
    d.save_screenshot(str(ARTIFACTS / "share-html-offline.png"))
