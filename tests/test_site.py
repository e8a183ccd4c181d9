"""The course website in a real browser: headless Chromium, driven by selenium, over the built site.

Runs with ``pytest --site`` (CONTRIBUTING.md's test command and CI pass it); without the option these tests
are skipped, with that reason shown. With it, a missing browser, driver or selenium FAILS the run: CI
installs Debian's ``chromium`` and ``chromium-driver``; ``CHROMIUM`` and ``CHROMEDRIVER`` point at others.

The session builds the site first, exactly as CONTRIBUTING.md says (Sphinx, warnings as errors), into
docs/_build/html, serves it from 127.0.0.1, and saves a screenshot of every page to
docs/_build/screenshots/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from helpers import assert_close

pytestmark = [pytest.mark.site, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SITE = DOCS / "_build" / "html"
SHOTS = DOCS / "_build" / "screenshots"
# As CONTRIBUTING.md says (tests/test_packaging.py checks that the two agree); the doctrees outside what is published.
BUILD = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", "docs/_build/doctrees", "docs",
         "docs/_build/html"]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
    "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
    "--disable-features=Translate,OptimizationHints,MediaRouter", "--window-size=1280,900",
    # A laptop with a mouse: headless Chromium otherwise says it has no pointer that can hover, as a phone does.
    # The touch-screen tests below turn touch emulation on, which makes (hover: none) true again.
    "--blink-settings=primaryHoverType=2,availableHoverTypes=2,primaryPointerType=4,availablePointerTypes=4",
    # Anything that tries to leave 127.0.0.1 fails to resolve; the request is still logged and reported.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


# Requests that never touch a network: inline data, and the browser's own pages (its start-up tab).
LOCAL_SCHEMES = ("data:", "blob:", "about:", "chrome:", "chrome-untrusted:", "chrome-extension:", "devtools:")


def expected_pages() -> list[str]:
    """Every page the site should have, from the sources (so a page that fails to build is noticed)."""
    pages = [p.relative_to(DOCS).with_suffix(".html").as_posix() for p in DOCS.glob("*.md")]
    pages += [f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")]
    pages += [f"notebooks/solutions/{p.stem}.html" for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb")]
    return sorted(pages + ["genindex.html", "py-modindex.html", "search.html"])


PAGES = expected_pages()


def load_demo():
    spec = importlib.util.spec_from_file_location("head_view_demo", DOCS / "head_view_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


# --- fixtures: the site, a local server, the browser ------------------------------------------------------


@pytest.fixture(scope="session")
def site():
    """Build the site as CONTRIBUTING.md says; incremental, so a second run in a session is quick."""
    result = subprocess.run(BUILD, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"the site does not build cleanly ({' '.join(BUILD[1:])}):\n{result.stdout[-2000:]}"
                    f"\n{result.stderr[-4000:]}", pytrace=False)
    return SITE


@pytest.fixture(scope="session")
def server(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


def find_browser() -> tuple[str, str]:
    chromium = os.environ.get("CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))),
        None,
    )
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(
            "The site tests need headless Chromium and its driver, and found "
            f"chromium={chromium!r}, chromedriver={driver!r}. On Debian or Ubuntu, as root: "
            "apt-get install -y chromium chromium-driver (or set CHROMIUM and CHROMEDRIVER to their paths).",
            pytrace=False,
        )
    return chromium, driver


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail('The site tests need selenium: pip install -e ".[docs]"', pytrace=False)
    chromium, driver_path = find_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    driver.get("about:blank")
    yield driver
    driver.quit()


def open_page(driver, url):
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    driver.get(url)
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "if (document.readyState === 'complete') done(); else window.addEventListener('load', () => done());"
    )


def requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    urls += driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return urls


def screenshot(driver, page):
    path = SHOTS / page.replace(".html", ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    driver.set_window_size(1280, min(max(height, 900), 8000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)


# Every <img> decoded: lazy images are told to load now, then each one is awaited.
IMAGES_JS = """
const done = arguments[arguments.length - 1];
const imgs = Array.from(document.images);
imgs.forEach(img => { img.loading = 'eager'; });
Promise.all(imgs.map(img => img.decode().catch(() => null))).then(() => done(
  imgs.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.currentSrc || img.src || img.outerHTML)
));
"""


# --- every page ---------------------------------------------------------------------------------------------


def test_every_expected_page_was_built(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    from sitecheck import site_pages

    built = sorted(p.relative_to(site).as_posix() for p in site_pages(site))
    assert built == PAGES


def test_internal_links_and_images_resolve_and_nothing_loads_from_outside(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    from sitecheck import check_site

    assert check_site(site) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_page_loads_without_errors_broken_images_or_outside_requests(page, browser, server):
    open_page(browser, server + page)
    broken_images = browser.execute_async_script(IMAGES_JS)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    outside = [u for u in requested_urls(browser) if not u.startswith((server, *LOCAL_SCHEMES))]
    n_images = browser.execute_script("return document.images.length")
    heading = browser.execute_script("const h = document.querySelector('main h1'); return h && h.textContent")
    screenshot(browser, page)
    assert not errors, f"JavaScript console errors on {page}: {errors}"
    assert not broken_images, f"{len(broken_images)} of {n_images} images not decoded on {page}: {broken_images}"
    assert not outside, f"{page} requested something outside the site: {outside}"
    if page not in ("search.html", "genindex.html", "py-modindex.html"):
        assert heading and heading.strip(), f"{page} has no title"


# --- the head view ----------------------------------------------------------------------------------------


def hv_read(driver, root):
    """Per token (keys, then queries): the head cells' opacities and the token's data-weight."""
    return driver.execute_script(
        """
        const side = s => Array.from(arguments[0].querySelectorAll('.mha-hv-tok[data-side=' + s + ']')).map(g => ({
          cells: Array.from(g.querySelectorAll('.mha-hv-cell')).map(c => Number(c.getAttribute('fill-opacity'))),
          weight: Number(g.getAttribute('data-weight')),
        }));
        const lines = Array.from(arguments[0].querySelectorAll('.mha-hv-lines line'));
        return {k: side('k'), q: side('q'), lines: lines.length,
                strokes: Array.from(new Set(lines.map(l => l.getAttribute('stroke')))),
                readout: arguments[0].querySelector('.mha-hv-readout').textContent};
        """,
        root,
    )


def clear_margin_argmax(values: torch.Tensor):
    """The index of the largest value, or None when the runner-up is within rounding (0.002) of it."""
    top = torch.topk(values, min(2, values.numel()))
    if values.numel() > 1 and top.values[0] - top.values[1] < 0.002:
        return None
    return int(top.indices[0])


def test_head_view_highlights_follow_the_weights(browser, server):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    demo = load_demo()
    weights = [w.double() for w in demo.weights()]  # per layer (h, T, T), computed here, not read from the page
    tokens = demo.TOKENS
    h, T, _ = weights[0].shape
    open_page(browser, server + "head_view.html")
    root = browser.find_element(By.CSS_SELECTOR, "div.mha-hv")
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", root)

    # It rendered: the interactive view replaced the static picture, with every head and token.
    assert root.find_element(By.CSS_SELECTOR, ".mha-hv-app").is_displayed()
    assert not root.find_element(By.CSS_SELECTOR, ".mha-hv-static").is_displayed()
    head_buttons = root.find_elements(By.CSS_SELECTOR, "button.mha-hv-head")
    assert len(head_buttons) == h
    queries = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=q]")
    keys = root.find_elements(By.CSS_SELECTOR, ".mha-hv-tok[data-side=k]")
    label = "return arguments[0].querySelector('text').textContent"
    assert [browser.execute_script(label, t) for t in queries] == tokens
    assert [browser.execute_script(label, t) for t in keys] == tokens
    idle = hv_read(browser, root)
    # Nothing selected: every head's lines of weight >= 0.01.
    assert idle["lines"] == int((torch.round(weights[0] * 1000) >= 10).sum()) > 0
    assert all(c == 0 for tok in idle["k"] for c in tok["cells"])

    act = ActionChains(browser)
    layer_menu = Select(root.find_element(By.CSS_SELECTOR, ".mha-hv-layer select"))
    checked = 0
    for layer, w in enumerate(weights):
        layer_menu.select_by_index(layer)
        for i in range(T):  # hover every query: the keys light up with that query's row of weights
            act.move_to_element(queries[i]).perform()
            seen = hv_read(browser, root)
            cells = torch.tensor([tok["cells"] for tok in seen["k"]], dtype=torch.float64).T  # (h, S)
            assert_close(cells, w[:, i, :], atol=6e-4, where=f"layer {layer}, query {i}")
            for k in range(h):
                best = clear_margin_argmax(w[k, i])
                if best is not None:  # the most-attended key is the most highlighted, head by head
                    assert int(cells[k].argmax()) == best, (layer, i, k)
                    checked += 1
            best = clear_margin_argmax(w[:, i].mean(0))
            if best is not None:  # and over all heads together
                assert max(range(T), key=lambda j: seen["k"][j]["weight"]) == best
            assert seen["lines"] == int((torch.round(w[:, i] * 1000) >= 10).sum())  # lines from query i only
            assert all(c == 0 for tok in seen["q"] for c in tok["cells"])
    assert checked > T  # the argmax check really ran

    # Hover a key: the queries light up with the weights *to* it (a column of each table).
    layer_menu.select_by_index(1)
    j = 2
    act.move_to_element(keys[j]).perform()
    seen = hv_read(browser, root)
    cells = torch.tensor([tok["cells"] for tok in seen["q"]], dtype=torch.float64).T  # (h, T)
    assert_close(cells, weights[1][:, :, j], atol=6e-4)
    assert "key \u201c" + tokens[j] + "\u201d" in seen["readout"]

    # Heads toggle: leave only head 2, and everything drawn is head 2's.
    for k in range(h):
        if k != 2:
            head_buttons[k].click()
    assert [b.get_attribute("aria-pressed") for b in head_buttons] == ["true" if k == 2 else "false" for k in range(h)]
    i = T - 1
    act.move_to_element(queries[i]).perform()
    seen = hv_read(browser, root)
    colors = json.loads(root.find_element(By.CSS_SELECTOR, "script.mha-hv-data").get_attribute("textContent"))["colors"]
    assert seen["strokes"] == [colors[2]]
    row = weights[1][2, i]
    assert [tok["weight"] for tok in seen["k"]] == pytest.approx(row.tolist(), abs=6e-4)
    assert f"head 2 \u2192 \u201c{tokens[int(row.argmax())]}\u201d" in seen["readout"]

    # Click pins the selection; moving away keeps it; a second click releases it.
    queries[i].click()
    act.move_to_element(root.find_element(By.CSS_SELECTOR, ".mha-hv-bar")).perform()
    assert hv_read(browser, root)["lines"] == int((torch.round(row * 1000) >= 10).sum())
    act.move_to_element(queries[i]).click().perform()
    act.move_to_element(root.find_element(By.CSS_SELECTOR, ".mha-hv-bar")).perform()
    assert hv_read(browser, root)["lines"] == int((torch.round(weights[1][2] * 1000) >= 10).sum())
    root.find_element(By.CSS_SELECTOR, "button.mha-hv-all").click()
    SHOTS.mkdir(parents=True, exist_ok=True)
    act.move_to_element(queries[7]).perform()  # "it"
    root.screenshot(str(SHOTS / "head_view_hover_it.png"))

    # Export: the current view as an SVG document and a PNG at twice its size.
    svg_text = browser.execute_script("return arguments[0].mhaHeadView.svgText()", root)
    svg = ET.fromstring(svg_text.split("?>", 1)[1])
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}line")) == hv_read(browser, root)["lines"] > 0
    assert "currentColor" not in svg_text
    url = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "arguments[0].mhaHeadView.pngDataURL().then(done, e => done('error: ' + e));", root)
    assert url.startswith("data:image/png;base64,"), url[:100]
    png = base64.b64decode(url.split(",", 1)[1])
    (SHOTS / "head_view_export.png").write_bytes(png)
    width = int.from_bytes(png[16:20], "big")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width == 2 * int(float(svg.get("width")))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


# --- a site that reads well (issue 19) ------------------------------------------------------------------------------

READER_WIDTH = 1200  # px: a laptop's browser window
GENERATED = ("search.html", "genindex.html", "py-modindex.html")

READING_JS = """
const visible = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
const pres = Array.from(document.querySelectorAll('main pre')).filter(visible)
  .filter(p => !p.closest('div.cell_output'));  // outputs keep their lines (test_pages_fit_the_screen... below)
const scrolling = pres.filter(p => p.scrollWidth > p.clientWidth + 1)
  .map(p => [p.scrollWidth, p.clientWidth, p.textContent.slice(0, 60)]);
const search = Array.from(document.querySelectorAll('.search-button-field, input[type=search]')).filter(visible)
  .filter(e => !e.closest('main'));  // the search page's own form is the page, not a box
const figures = Array.from(document.querySelectorAll('main div.cell_output img')).filter(visible).map(img => {
  const room = (img.closest('div.cell_output') || img.parentElement).getBoundingClientRect().width;
  return [img.naturalWidth, Math.round(img.getBoundingClientRect().width), Math.floor(room), img.src.slice(-30)];
});
const maths = Array.from(document.querySelectorAll('main div.math')).filter(visible).map(div => {
  const range = document.createRange(); range.selectNodeContents(div.querySelector('math'));
  const box = div.getBoundingClientRect(), ink = range.getBoundingClientRect();
  return [Math.round(ink.left - box.left), Math.round(box.right - ink.right)];
});
return {pres: pres.length, scrolling, search: search.length, figures, maths};
"""


def test_published_site_holds_only_what_a_reader_needs(site):
    """No doctrees, no copies of the page sources, no source maps: the built folder is what gets published."""
    assert not (site / ".doctrees").exists() and not (site / "_sources").exists()
    assert not list(site.rglob("*.map"))
    assert not list(site.rglob("*.ipynb")) and not list(site.rglob("*.doctree"))


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED])
def test_page_reads_well_at_1200px(page, browser, server):
    browser.set_window_size(READER_WIDTH, 900)
    try:
        open_page(browser, server + page)
        seen = browser.execute_script(READING_JS)
    finally:
        browser.set_window_size(1280, 900)
    # Code wraps or fits: none scrolls sideways (before: 33 of 40 blocks on notebook 03's page). Outputs keep their
    # lines instead, and may scroll inside their own box: test_pages_fit_the_screen_and_outputs_keep_their_lines.
    assert not seen["scrolling"], f"{len(seen['scrolling'])} of {seen['pres']} code blocks scroll on {page}"
    assert seen["search"] == 1, f"{seen['search']} search boxes on {page}"
    # Figures at their own size, scaled down only when wider than the column they sit in.
    squeezed = [f for f in seen["figures"] if abs(f[1] - min(f[0], f[2])) > 1]
    assert not squeezed, f"figures drawn smaller than they are, with room to spare, on {page}: {squeezed}"
    # Display maths centred: as much room to its left as to its right (before: all of it on the left).
    assert all(abs(left - right) <= 2 for left, right in seen["maths"]), f"off-centre formulas on {page}: {seen}"


def test_the_reading_checks_can_fail(browser, server):
    """The theme's own layout, undone: what the checks above would have seen before course.css."""
    browser.set_window_size(READER_WIDTH, 900)
    try:
        open_page(browser, server + "notebooks/01_scaled_dot_product_attention.html")
        sheets = browser.execute_script(
            "const on = Array.from(document.styleSheets).filter(s => (s.href || '').includes('course.css'));"
            "on.forEach(s => { s.disabled = true; }); return on.length;"
        )
        seen = browser.execute_script(READING_JS)
    finally:
        browser.set_window_size(1280, 900)
    assert sheets == 1 and seen["scrolling"] and any(abs(left - right) > 2 for left, right in seen["maths"]), seen


def test_landing_page_shows_the_series_as_cards_and_says_how_to_run_it(browser, server):
    from selenium.webdriver.common.by import By

    import mha

    open_page(browser, server + "index.html")
    chapters = sorted((ROOT / "notebooks").glob("*.ipynb"))
    cards = browser.find_elements(By.CSS_SELECTOR, "main .mha-card")
    assert len(cards) == len(chapters)
    for card, path in zip(cards, chapters):
        links = [a.get_attribute("href") for a in card.find_elements(By.TAG_NAME, "a")]
        assert server + f"notebooks/{path.stem}.html" in links
        assert any(u.startswith("https://colab.research.google.com/github/") and u.endswith(f"notebooks/{path.name}")
                   for u in links)
    pictures = browser.find_elements(By.CSS_SELECTOR, "main img")
    assert len(pictures) == 1 and pictures[0].get_attribute("alt")
    run = browser.find_element(By.ID, "run-it-yourself").text
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in run
    assert f"pip install mha=={mha.__version__}" in run


def public_names(module) -> list[str]:
    """What a reader of a module may use: its __all__ (modules left out), or the functions and classes of mha in it."""
    import inspect

    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if not inspect.ismodule(getattr(module, n))]
    return [n for n, obj in vars(module).items() if not n.startswith("_") and (inspect.isfunction(obj) or
            inspect.isclass(obj)) and getattr(obj, "__module__", "").startswith("mha")]


def test_api_reference_covers_every_public_name_grouped_by_topic(site):
    import importlib

    page = (site / "api.html").read_text(encoding="utf-8")
    page = page[page.index('<article class="bd-article">'):]  # the page itself, not the sidebars
    headings = [(m.start(), re.sub(r"<[^>]+>|#", "", m.group(1)).strip())
                for m in re.finditer(r"<h2>(.*?)</h2>", page, re.S)]
    titles = [t for _, t in headings]
    assert titles == ["The layer", "The function", "Masks", "The KV cache", "PyTorch interop", "Plotting: mha.plot",
                      "Exercises: mha.exercises", "Tensor parallelism: mha.parallel"], titles

    def section_of(anchor):
        at = page.find(f'id="{anchor}"')
        assert at >= 0, f"the API reference does not document {anchor}"
        return [t for start, t in headings if start < at][-1]

    expected = {"MultiHeadAttention": "The layer", "count_parameters": "The layer",
                "scaled_dot_product_attention": "The function", "split_heads": "The function",
                "causal_mask": "Masks", "to_torch_attn_mask": "Masks", "KVCache": "The KV cache",
                "from_torch": "PyTorch interop", "to_torch": "PyTorch interop"}
    import mha

    for name in public_names(mha):
        topic = section_of(f"mha.{name}")
        assert expected.get(name, topic) == topic, (name, topic)
    for module, topic in (("mha.plot", "Plotting"), ("mha.exercises", "Exercises"), ("mha.parallel", "Tensor")):
        names = public_names(importlib.import_module(module))
        assert names, module
        for name in names:
            assert section_of(f"{module}.{name}").startswith(topic), f"{module}.{name}"


# --- a site that works on a phone (issue 26) -------------------------------------------------------------------------
# At 390 px (a phone, emulated as one: mobile viewport, touch) and at 1280 px (a laptop's browser window).

PHONE, LAPTOP = 390, 1280
NOTEBOOK_PAGES = [p for p in PAGES if p.startswith("notebooks/")]
COLAB_URL = "https://colab.research.google.com/"


class screen:
    """The browser as a screen ``width`` px wide, for the pages opened inside the ``with``: a phone below 600 px (a
    mobile viewport, with touch), else a desktop window."""

    def __init__(self, browser, width, touch=None):
        self.browser, self.width = browser, width
        self.touch = width < 600 if touch is None else touch

    def __enter__(self):
        self.browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": self.width, "height": 844 if self.width < 600 else 900, "deviceScaleFactor": 1,
            "mobile": self.width < 600})
        self.browser.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": self.touch, "maxTouchPoints": 5})
        return self

    def __exit__(self, *exc):
        self.browser.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})
        self.browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


SCREEN_JS = """
const visible = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
const width = document.documentElement.clientWidth;
const outputs = Array.from(document.querySelectorAll('main div.cell_output pre')).filter(visible).map(p => {
  const s = getComputedStyle(p);
  const lines = p.textContent.replace(/\\n+$/, '').split('\\n').length;
  const range = document.createRange(); range.selectNodeContents(p);
  const rows = Math.round(range.getBoundingClientRect().height / parseFloat(s.lineHeight));
  const box = p.getBoundingClientRect();
  return {lines, rows, whiteSpace: s.whiteSpace, overflowX: s.overflowX, right: Math.ceil(box.right),
          scrolls: p.scrollWidth > p.clientWidth + 1, text: p.textContent.slice(0, 50)};
});
const figures = Array.from(document.querySelectorAll('main div.cell_output img')).filter(visible).map(img => {
  const link = img.closest('a');
  return {natural: img.naturalWidth, shown: Math.round(img.getBoundingClientRect().width), src: img.src,
          link: link ? link.href : null, hint: link ? getComputedStyle(link, '::after').content : 'none',
          right: Math.ceil(img.getBoundingClientRect().right)};
});
const colab = Array.from(document.querySelectorAll('a[href]')).filter(a => a.href.startsWith(arguments[0]))
  .map(a => ({href: a.href, badge: !!a.querySelector('img[alt="Open In Colab"]'), card: !!a.closest('.mha-card')}));
return {width, scrollWidth: document.documentElement.scrollWidth, outputs, figures, colab};
"""


def measure(browser, server, page, width):
    with screen(browser, width):
        open_page(browser, server + page)
        browser.execute_async_script(IMAGES_JS)  # every figure decoded, so that its natural width is known
        return browser.execute_script(SCREEN_JS, COLAB_URL)


@pytest.mark.parametrize("width", [PHONE, LAPTOP])
@pytest.mark.parametrize("page", PAGES)
def test_pages_fit_the_screen_and_outputs_keep_their_lines(page, width, browser, server):
    seen = measure(browser, server, page, width)
    # No page is wider than the screen (before: the API page 497 px at 390, genindex 586, notebooks 05, 07 and 08
    # 421 to 439). At 390 the phone's viewport is the screen's 390 px; at 1280 the window less its scrollbar.
    assert seen["scrollWidth"] <= min(seen["width"], width), f"{page} is {seen['scrollWidth']} px wide at {width}"
    # Output tables keep their columns: every printed line is one line on the screen (before: at 390 px, 158 of the
    # 171 output blocks had a wrapped line, at 1280 px 58), and a wide one scrolls inside its own box.
    wrapped = [o for o in seen["outputs"] if o["rows"] > o["lines"]]
    assert not wrapped, f"{len(wrapped)} of {len(seen['outputs'])} outputs wrap lines on {page} at {width}: {wrapped}"
    for o in seen["outputs"]:
        assert o["whiteSpace"] == "pre" and o["overflowX"] in ("auto", "scroll"), o
        assert o["right"] <= seen["width"], f"an output box wider than the screen on {page} at {width}: {o}"
    # Figures fit the screen; one shrunk to less than 3/4 of its own width opens at full size on a tap (a link to its
    # own file), and on the phone a line under a wide one says so.
    for f in seen["figures"]:
        assert f["right"] <= seen["width"], f
        if f["shown"] < 0.75 * f["natural"]:
            assert f["link"] == f["src"], f"a shrunk figure that does not open at full size on {page}: {f}"
            if width == PHONE:
                assert "Tap the figure to see it at full size" in f["hint"], f


def test_the_screen_checks_can_fail(browser, server):
    """course.css undone, on notebook 03's page at 390 px: its outputs wrap and the page is wider than the phone."""
    with screen(browser, PHONE):
        open_page(browser, server + "notebooks/03_why_several_heads.html")
        browser.execute_script(
            "Array.from(document.styleSheets).filter(s => (s.href || '').includes('course.css'))"
            ".forEach(s => { s.disabled = true; });")
        # the theme's own rule for outputs, as before issue 26 (course.css made them wrap)
        browser.execute_script("document.querySelectorAll('div.cell_output pre').forEach(p => {"
                               "p.style.whiteSpace = 'pre-wrap'; });")
        seen = browser.execute_script(SCREEN_JS, COLAB_URL)
    assert sum(o["rows"] > o["lines"] for o in seen["outputs"]) > 5, seen["outputs"][:3]
    assert any(f["shown"] < 0.75 * f["natural"] for f in seen["figures"])  # the figures the tap link is for


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED])
def test_links_stay_on_the_site_and_colab_is_one_badge_per_notebook_page(page, browser, server):
    seen = measure(browser, server, page, LAPTOP)
    if page.startswith("notebooks/"):
        # Before: 4 to 9 links to Colab on a notebook's page (Previous, Next, the 15-minute path, the solutions).
        notebook = page.removesuffix(".html") + ".ipynb"
        assert [c["href"] for c in seen["colab"]] == [f"{COLAB_URL}github/transformer-on-ramp/mha/blob/main/{notebook}"]
        assert seen["colab"][0]["badge"], seen["colab"]
    else:  # the landing page's cards each have an "Open in Colab"; no other page links to Colab
        assert all(c["card"] for c in seen["colab"]), seen["colab"]
        assert bool(seen["colab"]) == (page == "index.html")


def test_the_notebooks_links_to_each_other_open_their_pages_on_the_site(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server + "notebooks/02_multi_head_attention.html")
    first = browser.find_element(By.CSS_SELECTOR, "main section")  # the title cell: Previous, Next
    hrefs = [a.get_attribute("href") for a in first.find_elements(By.CSS_SELECTOR, "a[href]")]
    assert server + "notebooks/01_scaled_dot_product_attention.html" in hrefs
    assert server + "notebooks/03_why_several_heads.html" in hrefs
    # Every link of the page that names a notebook, but the badge, is a page of the site, and the page exists.
    site_hrefs = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "main a[href]")
                  if not a.find_elements(By.CSS_SELECTOR, 'img[alt="Open In Colab"]')]
    to_notebooks = [h for h in site_hrefs if re.search(r"/notebooks/.*\d\d_\w+\.(html|ipynb)", h)]
    assert to_notebooks and all(h.startswith(server) and ".ipynb" not in h for h in to_notebooks), to_notebooks
    for href in to_notebooks:
        assert (SITE / href.removeprefix(server).split("#")[0]).is_file(), href


@pytest.mark.parametrize("touch", [False, True], ids=["mouse", "touch"])
def test_the_head_view_says_tap_on_a_touch_screen_and_hover_with_a_mouse(touch, browser, server):
    from selenium.webdriver.common.by import By

    with screen(browser, PHONE if touch else LAPTOP, touch=touch):
        open_page(browser, server + "head_view.html")
        hover_none = browser.execute_script("return matchMedia('(hover: none)').matches")
        readout = browser.find_element(By.CSS_SELECTOR, "div.mha-hv .mha-hv-readout").text
    assert hover_none == touch
    if touch:
        assert readout.startswith("Tap a token") and "tap again to release" in readout and "Hover" not in readout
    else:
        assert readout.startswith("Hover a token") and "click to pin" in readout
