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
const pres = Array.from(document.querySelectorAll('main pre')).filter(visible);
const scrolling = pres.filter(p => p.scrollWidth > p.clientWidth + 1)
  .map(p => [p.scrollWidth, p.clientWidth, p.textContent.slice(0, 60)]);
const search = Array.from(document.querySelectorAll('.search-button-field, input[type=search]')).filter(visible)
  .filter(e => !e.closest('main'));  // the search page's own form is the page, not a box
const figures = Array.from(document.querySelectorAll('main div.cell_output img')).filter(visible).map(img => {
  const room = img.parentElement.getBoundingClientRect().width;
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
    # Code and outputs wrap or fit: none scrolls sideways (before: 33 of 40 blocks on notebook 03's page).
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
