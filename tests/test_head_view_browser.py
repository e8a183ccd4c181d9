"""mha.plot.head_view in headless Chromium, from a standalone page (no site build): that it handles any token a
tokenizer makes and stays usable at a real model's size.

Website tests: they run with --site (CI does), and need selenium and Chromium. The walk through the view (hover,
heads, layers, pinning, export) is tested once, on the website, in test_site.py.
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
