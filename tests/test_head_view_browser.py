"""mha.plot.head_view in headless Chromium, from a standalone page (no site build): that it renders, shows
what the weights say, handles any token a tokenizer makes, and stays usable at a real model's size.

Website tests: they run with --site (CI does), and need selenium and Chromium. The full walk through the
view (hover, heads, layers, export) on the website is in test_site.py.
"""

import os
import shutil

import pytest
import torch
from helpers import assert_close

import mha
from mha.plot import head_view

pytestmark = [pytest.mark.site, pytest.mark.slow]

READ = """
const root = arguments[0];
const side = s => Array.from(root.querySelectorAll('.mha-hv-tok[data-side=' + s + ']')).map(g => ({
  label: g.querySelector('text').textContent,
  cells: Array.from(g.querySelectorAll('.mha-hv-cell')).map(c => Number(c.getAttribute('fill-opacity'))),
}));
return {q: side('q'), k: side('k'), lines: root.querySelectorAll('.mha-hv-lines line').length,
        readout: root.querySelector('.mha-hv-readout').textContent,
        error: root.mhaHeadView && root.mhaHeadView.error ? String(root.mhaHeadView.error) : null,
        app: !root.querySelector('.mha-hv-app').hidden, note: (root.querySelector('.mha-hv-note') || {}).textContent};
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(f"needs Chromium and chromedriver, found {chromium!r} and {driver!r}", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={tmp_path_factory.mktemp('profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    b.set_script_timeout(60)
    yield b
    b.quit()


def show(browser, view, tmp_path, name="view"):
    """Open the view as a standalone page; return its root element and what READ finds there."""
    from selenium.webdriver.common.by import By

    path = tmp_path / f"{name}.html"
    view.save(path)
    browser.get_log("browser")
    browser.get(path.as_uri())
    root = browser.find_element(By.CSS_SELECTOR, "div.mha-hv")
    browser.execute_async_script(  # the view starts itself; wait until it has
        "const [root, done] = arguments; (function wait() { root.mhaHeadView ? done() : setTimeout(wait, 20); })();",
        root)
    return root, browser.execute_script(READ, root)


def weights(h=3, T=5, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        _, w = mha.MultiHeadAttention(8 * h, h)(torch.randn(1, T, 8 * h))
    return w[0]


def test_the_view_renders_and_hovering_a_query_lights_its_row(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    w = weights()
    tokens = ["the", "cat", "sat", "on", "mats"]
    root, seen = show(browser, head_view(w, tokens), tmp_path)
    assert seen["error"] is None and seen["app"]
    assert [t["label"] for t in seen["q"]] == [t["label"] for t in seen["k"]] == tokens
    assert seen["lines"] == int((torch.round(w * 1000) >= 10).sum())
    queries = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=q]")
    ActionChains(browser).move_to_element(queries[3]).perform()
    seen = browser.execute_script(READ, root)
    cells = torch.tensor([t["cells"] for t in seen["k"]], dtype=torch.float64).T  # (h, S)
    assert_close(cells, w[:, 3].double(), atol=6e-4)
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_layers_heads_pinning_and_export(browser, tmp_path):
    import base64
    import xml.etree.ElementTree as ET

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    w0, w1 = weights(seed=0), weights(seed=1)
    tokens = ["a", "b", "c", "d", "e"]
    root, _ = show(browser, head_view([w0, w1], tokens, layer_names=["first", "second"]), tmp_path)
    Select(root.find_element(By.CSS_SELECTOR, ".mha-hv-layer select")).select_by_index(1)
    keys = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=k]")
    ActionChains(browser).move_to_element(keys[1]).perform()  # a key: the queries light up with its column
    seen = browser.execute_script(READ, root)
    cells = torch.tensor([t["cells"] for t in seen["q"]], dtype=torch.float64).T  # (h, T)
    assert_close(cells, w1[:, :, 1].double(), atol=6e-4)
    assert "key \u201cb\u201d gets most attention from" in seen["readout"]
    buttons = root.find_elements(By.CSS_SELECTOR, "button.mha-hv-head")
    buttons[0].click()
    buttons[2].click()  # only head 1 is left
    queries = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=q]")
    queries[4].click()  # pin query 4
    ActionChains(browser).move_to_element(root.find_element(By.CSS_SELECTOR, ".mha-hv-bar")).perform()
    seen = browser.execute_script(READ, root)
    assert seen["lines"] == int((torch.round(w1[1, 4] * 1000) >= 10).sum())  # head 1's lines from query 4
    svg_text = browser.execute_script("return arguments[0].mhaHeadView.svgText()", root)
    exported = ET.fromstring(svg_text.split("?>", 1)[1])
    assert len(exported.findall(".//{http://www.w3.org/2000/svg}line")) == seen["lines"]
    url = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "arguments[0].mhaHeadView.pngDataURL().then(done, e => done('error: ' + e));", root)
    png = base64.b64decode(url.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 2 * int(float(exported.get("width")))  # twice the view's size
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_C16_a_512_token_view_runs_and_shows_the_weights_it_kept(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    w = weights(h=12, T=512)
    view = head_view(w, [f"t{i}" for i in range(512)])
    root, seen = show(browser, view, tmp_path, "large")
    assert seen["error"] is None and seen["app"]
    assert seen["lines"] == 0 and "too many to draw all at once" in seen["readout"]  # the overview is not drawn
    notes = [e.text for e in root.find_elements(By.CSS_SELECTOR, ".mha-hv-app .mha-hv-note")]
    assert notes == [view.note] and notes[0].startswith("Large view: weights below 0.010")
    queries = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=q]")
    ActionChains(browser).scroll_to_element(queries[300]).move_to_element(queries[300]).perform()
    seen = browser.execute_script(READ, root)
    cells = torch.tensor([t["cells"] for t in seen["k"]], dtype=torch.float64).T  # (h, S)
    row = torch.round(w[:, 300].double() * 1000) / 1000
    kept = (row >= 0.01) | torch.nn.functional.one_hot(row.argmax(-1), 512).bool()  # and each row's first largest
    assert_close(cells, torch.where(kept, row, 0.0), atol=6e-4)
    assert seen["lines"] == int((row >= 0.01).sum())
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_any_token_is_drawn_as_the_static_picture_draws_it_and_stays_in_its_place(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from test_head_view import NASTY

    from mha.plot.labels import display_label

    T = len(NASTY)
    w = torch.softmax(torch.arange(2 * T * T, dtype=torch.float64).reshape(2, T, T).sin() * 3, dim=-1)
    root, seen = show(browser, head_view(w, NASTY, layer_names=["\u202e<layer>"]), tmp_path, "nasty")
    assert seen["error"] is None and seen["app"]
    assert [t["label"] for t in seen["q"]] == [display_label(t, 24) for t in NASTY]  # the JS labels the same way
    assert all(len(t["label"]) <= 24 for t in seen["k"])
    queries = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=q]")
    i = NASTY.index("שלום")
    ActionChains(browser).move_to_element(queries[i]).perform()
    isolated = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('.mha-hv-readout bdi')).map(b => b.textContent)", root)
    assert isolated[0] == "שלום" and len(isolated) == 1 + 2  # the query, then each head's top key, each isolated
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
