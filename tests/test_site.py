"""The course website in a real browser: headless Chromium, driven by selenium, over the built site.

Runs with ``pytest --site`` (``make test`` passes it); without the option these tests are skipped, with that reason
shown. With it, a missing browser, driver or selenium FAILS the run: CI installs Debian's ``chromium`` and
``chromium-driver``; ``CHROMIUM`` and ``CHROMEDRIVER`` point at others.

The session builds the site first with ``make docs`` (Sphinx, warnings as errors; the build itself checks every
internal link and image, docs/_ext/sitecheck.py), serves docs/_build/html from 127.0.0.1, and saves a screenshot of
every page to docs/_build/screenshots/ (git-ignored) for a person to look at.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
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

pytestmark = [pytest.mark.site, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SITE = DOCS / "_build" / "html"
SHOTS = DOCS / "_build" / "screenshots"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
    "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
    "--disable-features=Translate,OptimizationHints,MediaRouter", "--window-size=1280,900",
    # A laptop with a mouse: headless Chromium otherwise says it has no pointer that can hover, as a phone does.
    # The phone's screen below turns touch emulation on, which makes (hover: none) true again.
    "--blink-settings=primaryHoverType=2,availableHoverTypes=2,primaryPointerType=4,availablePointerTypes=4",
    # Anything that tries to leave 127.0.0.1 fails to resolve; the request is still logged and reported.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
# Requests that never touch a network: inline data, and the browser's own pages (its start-up tab).
LOCAL_SCHEMES = ("data:", "blob:", "about:", "chrome:", "chrome-untrusted:", "chrome-extension:", "devtools:")
COLAB_URL = "https://colab.research.google.com/"
PHONE, LAPTOP = 390, 1280
GENERATED = ("search.html", "genindex.html", "py-modindex.html")


def expected_pages() -> list[str]:
    """Every page the site should have, from the sources (so a page that fails to build is noticed)."""
    pages = [p.relative_to(DOCS).with_suffix(".html").as_posix() for p in DOCS.glob("*.md")]
    pages += [f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")]
    pages += [f"notebooks/solutions/{p.stem}.html" for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb")]
    return sorted(pages + list(GENERATED))


PAGES = expected_pages()
NOTEBOOK_PAGES = [p for p in PAGES if p.startswith("notebooks/")]



@pytest.fixture(scope="session")
def site():
    """The site, built by `make docs` with this interpreter; incremental, so a second build is quick."""
    r = subprocess.run(["make", "docs", f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        pytest.fail(f"the site does not build cleanly (make docs):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}",
                    pytrace=False)
    return SITE


@pytest.fixture(scope="session")
def server(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    from selenium import webdriver  # the docs extra
    from selenium.webdriver.chrome.service import Service

    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
    driver_path = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail(f"The site tests need headless Chromium and its driver, and found chromium={chromium!r}, "
                    f"chromedriver={driver_path!r}. On Debian or Ubuntu, as root: apt-get install -y chromium "
                    "chromium-driver (or set CHROMIUM and CHROMEDRIVER to their paths).", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@contextlib.contextmanager
def screen(browser, width, touch=None):
    """The browser as a screen ``width`` px wide: a phone below 600 px (a mobile viewport, with touch), else a
    desktop window."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 844 if width < 600 else 900, "deviceScaleFactor": 1, "mobile": width < 600})
    touch = width < 600 if touch is None else touch
    browser.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": touch, "maxTouchPoints": 5})
    try:
        yield
    finally:
        browser.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# Every <img> decoded: lazy images are told to load now, then each one is awaited. Returns those that did not load.
IMAGES_JS = """
const done = arguments[arguments.length - 1];
const imgs = Array.from(document.images);
imgs.forEach(img => { img.loading = 'eager'; });
Promise.all(imgs.map(img => img.decode().catch(() => null))).then(() => done(
  imgs.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.currentSrc || img.src || img.outerHTML)
));
"""


def open_page(driver, url):
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    driver.get(url)
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "if (document.readyState === 'complete') done(); else window.addEventListener('load', () => done());")
    return driver.execute_async_script(IMAGES_JS)



def test_every_expected_page_was_built_and_only_what_a_reader_needs_is_published(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    from sitecheck import site_pages

    assert sorted(p.relative_to(site).as_posix() for p in site_pages(site)) == PAGES
    # No doctrees, no copies of the page sources, no source maps: the built folder is what gets published.
    assert not (site / ".doctrees").exists() and not (site / "_sources").exists()
    assert not [p for p in site.rglob("*") if p.suffix in (".map", ".ipynb", ".doctree")]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_loads_without_errors_broken_images_or_outside_requests(page, browser, server):
    broken = open_page(browser, server + page)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    urls = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in urls if m["method"] == "Network.requestWillBeSent"]
    urls += browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    heading = browser.execute_script("const h = document.querySelector('main h1'); return h && h.textContent")
    path = SHOTS / page.replace(".html", ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    browser.set_window_size(1280, min(max(height, 900), 8000))
    browser.save_screenshot(str(path))
    browser.set_window_size(1280, 900)
    assert not errors, f"JavaScript console errors on {page}: {errors}"
    assert not broken, f"images not decoded on {page}: {broken}"
    assert not [u for u in urls if not u.startswith((server, *LOCAL_SCHEMES))], f"{page} requested outside the site"
    assert page in GENERATED or (heading and heading.strip()), f"{page} has no title"


# What a page looks like on a screen: its width, its code blocks, outputs, figures, display maths and Colab links.
PAGE_JS = """
const visible = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
const width = document.documentElement.clientWidth;
const code = Array.from(document.querySelectorAll('main pre')).filter(visible)
  .filter(p => !p.closest('div.cell_output') && p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 60));
const outputs = Array.from(document.querySelectorAll('main div.cell_output pre')).filter(visible).map(p => {
  const s = getComputedStyle(p);
  const lines = p.textContent.replace(/\\n+$/, '').split('\\n').length;
  const range = document.createRange(); range.selectNodeContents(p);
  const rows = Math.round(range.getBoundingClientRect().height / parseFloat(s.lineHeight));
  return {lines, rows, whiteSpace: s.whiteSpace, overflowX: s.overflowX,
          right: Math.ceil(p.getBoundingClientRect().right), text: p.textContent.slice(0, 50)};
});
const figures = Array.from(document.querySelectorAll('main div.cell_output img')).filter(visible).map(img => {
  const link = img.closest('a');
  const room = (img.closest('div.cell_output') || img.parentElement).getBoundingClientRect().width;
  return {natural: img.naturalWidth, shown: Math.round(img.getBoundingClientRect().width), room: Math.floor(room),
          src: img.src, link: link ? link.href : null, hint: link ? getComputedStyle(link, '::after').content : 'none',
          right: Math.ceil(img.getBoundingClientRect().right)};
});
const maths = Array.from(document.querySelectorAll('main div.math')).filter(visible).map(div => {
  const range = document.createRange(); range.selectNodeContents(div.querySelector('math'));
  const box = div.getBoundingClientRect(), ink = range.getBoundingClientRect();
  return [Math.round(ink.left - box.left), Math.round(box.right - ink.right)];
});
const search = Array.from(document.querySelectorAll('.search-button-field, input[type=search]')).filter(visible)
  .filter(e => !e.closest('main')).length;  // the search page's own form is the page, not a box
const colab = Array.from(document.querySelectorAll('a[href]')).filter(a => a.href.startsWith(arguments[0]))
  .map(a => ({href: a.href, badge: !!a.querySelector('img[alt="Open In Colab"]'), card: !!a.closest('.mha-card')}));
return {width, scrollWidth: document.documentElement.scrollWidth, code, outputs, figures, maths, search, colab};
"""


def measure(browser, server, page, width):
    with screen(browser, width):
        open_page(browser, server + page)
        return browser.execute_script(PAGE_JS, COLAB_URL)


@pytest.mark.parametrize("width", [PHONE, LAPTOP])
@pytest.mark.parametrize("page", PAGES)
def test_pages_fit_the_screen_and_read_well(page, width, browser, server):
    seen = measure(browser, server, page, width)
    # No page is wider than the screen (before issue 26: the API page 497 px at 390, genindex 586).
    assert seen["scrollWidth"] <= min(seen["width"], width), f"{page} is {seen['scrollWidth']} px wide at {width}"
    # Code wraps: no block scrolls sideways (before issue 19: 33 of 40 blocks on notebook 03's page).
    assert not seen["code"], f"code blocks that scroll on {page} at {width}: {seen['code']}"
    # Output tables keep their columns: every printed line is one line on the screen, and a wide one scrolls inside
    # its own box (before issue 26: at 390 px, 158 of the 171 output blocks had a wrapped line).
    wrapped = [o for o in seen["outputs"] if o["rows"] > o["lines"]]
    assert not wrapped, f"{len(wrapped)} of {len(seen['outputs'])} outputs wrap lines on {page} at {width}: {wrapped}"
    for o in seen["outputs"]:
        assert o["whiteSpace"] == "pre" and o["overflowX"] in ("auto", "scroll") and o["right"] <= seen["width"], o
    # Figures at their own size, scaled down only when wider than their column; one shrunk to less than 3/4 of its
    # width opens at full size on a tap (a link to its own file), and on the phone a line under it says so.
    for f in seen["figures"]:
        assert f["right"] <= seen["width"] and abs(f["shown"] - min(f["natural"], f["room"])) <= 1, f
        if f["shown"] < 0.75 * f["natural"]:
            assert f["link"] == f["src"], f"a shrunk figure that does not open at full size on {page}: {f}"
            assert width != PHONE or "Tap the figure to see it at full size" in f["hint"], f
    # On a laptop, display maths centred (before issue 19: pushed to the right edge; on a phone a wide formula
    # scrolls), and one search box, the header's.
    if width == LAPTOP:
        assert all(abs(left - right) <= 2 for left, right in seen["maths"]), f"off-centre formulas on {page}"
        assert page in GENERATED or seen["search"] == 1, f"{seen['search']} search boxes on {page}"


@pytest.mark.parametrize("page", [p for p in PAGES if p not in GENERATED])
def test_links_stay_on_the_site_and_colab_is_one_badge_per_notebook_page(page, browser, server):
    seen = measure(browser, server, page, LAPTOP)
    if page.startswith("notebooks/"):
        # Before: 4 to 9 links to Colab on a notebook's page (Previous, Next, the 15-minute path, the solutions).
        notebook = page.removesuffix(".html") + ".ipynb"
        assert [c["href"] for c in seen["colab"]] == [f"{COLAB_URL}github/transformer-on-ramp/mha/blob/main/{notebook}"]
        assert seen["colab"][0]["badge"], seen["colab"]
    else:  # the landing page's cards each have an "Open in Colab"; no other page links to Colab
        assert all(c["card"] for c in seen["colab"]) and bool(seen["colab"]) == (page == "index.html"), seen["colab"]


def test_the_install_cell_is_folded_on_every_notebook_page(browser, server):
    """Each notebook's install cell is tagged hide-input: its page shows a "Show code cell source" fold instead of
    27 lines of pip (issue 29), while Colab runs the notebook's cell whole."""
    folded = {}
    for page in NOTEBOOK_PAGES:
        open_page(browser, server + page)
        folded[page] = browser.execute_script(
            "const cell = document.querySelector('main div.cell'); const input = cell.querySelector('.cell_input');"
            "const fold = input.closest('details'); return [input.textContent.includes('google.colab'),"
            " !!fold && !fold.open, input.checkVisibility()];")  # the install cell, folded, its code not shown
    assert {p: f for p, f in folded.items() if f != [True, True, False]} == {}



def readme_tiers() -> dict[str, list[str]]:
    """README.md's three tiers: ``### The lesson: ...`` and the notebooks its table lists, in order."""
    tiers, tier = {}, None
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            tier = line[4:].split(":")[0] if line.startswith("### ") else None
        elif tier and (m := re.match(r"\| \d\d \| \[[^]]+\]\([^)]*/notebooks/(\w+)\.html\)", line)):
            tiers.setdefault(tier, []).append(m.group(1))
    return tiers


def svg_text_px(path: Path, shown_width: float) -> float:
    """The smallest text of an SVG drawn ``shown_width`` px wide, in px."""
    svg = ET.parse(path).getroot()
    scale = shown_width / float(svg.get("viewBox").split()[2])
    return scale * min(float(e.get("font-size")) for e in svg.iter() if e.get("font-size"))


def test_landing_page_shows_the_tiers_as_cards_the_diagram_readable_and_the_ways_in_that_work(browser, server):
    import mha

    found = {}
    for width in (PHONE, 768, 1200, LAPTOP):
        with screen(browser, width):
            open_page(browser, server + "index.html")
            found[width] = browser.execute_script(
                "const img = document.querySelector('main img.mha-hero');"
                "return [img.currentSrc.split('/').pop(), img.getBoundingClientRect().width, img.alt];")
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('main .mha-card')).map(c => ({"
        "  tier: c.closest('section').querySelector('h3').textContent.replace('#', '').trim(),"
        "  title: c.querySelector('.sd-card-title').textContent.trim(),"
        "  links: Array.from(c.querySelectorAll('a')).map(a => [a.textContent, a.href])}));")
    run = " ".join(browser.execute_script("return document.getElementById('run-it-yourself').textContent").split())
    # The tiers, as the README has them, each card with its number and title, its page and its Colab link.
    tiers = {}
    for card in cards:
        number, title = card["title"].split(" · ")
        (path,) = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
        heading = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        assert heading.startswith(f"# {title}"), (card, heading)
        assert card["links"] == [["Read", f"{server}notebooks/{path.stem}.html"],
                                 ["Open in Colab", f"{COLAB_URL}github/transformer-on-ramp/mha/blob/main/notebooks/"
                                                   f"{path.name}"]], card
        tiers.setdefault(card["tier"], []).append(path.stem)
    assert tiers == readme_tiers() and list(tiers) == ["The lesson", "The evidence", "Going further"], tiers
    assert sorted(sum(tiers.values(), [])) == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    # The diagram: its tall version on a phone, and its text at least 9 px wherever it is shown.
    assert found[PHONE][0] == "multi-head-attention-tall.svg" and found[LAPTOP][0] == "multi-head-attention.svg"
    for width, (name, shown, alt) in found.items():
        assert svg_text_px(DOCS / "_static" / name, shown) >= 9 and alt, (width, name, shown)
    # The ways in say that no release is on PyPI yet, and give the one that works.
    assert "No release of mha is on PyPI yet" in run and f"installs release {mha.__version__} of mha" in run
    assert 'pip install "mha @ git+https://github.com/transformer-on-ramp/mha"' in run
    assert "git clone https://github.com/transformer-on-ramp/mha && cd mha" in run



def test_api_reference_documents_every_public_name_under_its_topic(site):
    """course.py's build fails on a public name without a topic; this checks the page as built, and where 0.5.0's
    moved names landed."""
    import importlib

    page = (site / "api.html").read_text(encoding="utf-8")
    page = page[page.index('<article class="bd-article">'):]  # the page itself, not the sidebars
    headings = [(m.start(), re.sub(r"<[^>]+>|#", "", m.group(1)).strip())
                for m in re.finditer(r"<h2>(.*?)</h2>", page, re.S)]
    topic = {}
    for module in ("mha", "mha.plot", "mha.exercises", "mha.parallel"):
        names = importlib.import_module(module).__all__
        for name in [n for n in names if n != "exercises"]:  # mha.exercises, a module, has its own topic
            at = page.find(f'id="{module}.{name}"')
            assert at >= 0, f"the API reference does not document {module}.{name}"
            topic[f"{module}.{name}"] = [t for start, t in headings if start < at][-1]
    expected = {"mha.MultiHeadAttention": "The layer", "mha.count_parameters": "The layer",
                "mha.GroupedQueryAttention": "Grouped-query attention and the KV cache",
                "mha.KVCache": "Grouped-query attention and the KV cache", "mha.project": "Heads",
                "mha.split_heads": "Heads", "mha.to_additive_mask": "PyTorch interop",
                "mha.to_torch_attn_mask": "PyTorch interop", "mha.plot.head_view": "Plotting: mha.plot",
                "mha.parallel.shard_heads": "Tensor parallelism: mha.parallel"}
    assert {n: topic[n] for n in expected} == expected


@pytest.mark.parametrize("touch", [False, True], ids=["mouse", "touch"])
def test_the_head_view_runs_on_its_page_and_says_tap_on_a_touch_screen(touch, browser, server):
    """Its interactions are tested on a standalone page (tests/test_head_view_browser.py); here, that it replaces its
    static picture on the site, and that its instructions match the screen."""
    from selenium.webdriver.common.by import By

    with screen(browser, PHONE if touch else LAPTOP, touch=touch):
        open_page(browser, server + "head_view.html")
        hover_none = browser.execute_script("return matchMedia('(hover: none)').matches")
        root = browser.find_element(By.CSS_SELECTOR, "div.mha-hv")
        shown = [root.find_element(By.CSS_SELECTOR, c).is_displayed() for c in (".mha-hv-app", ".mha-hv-static")]
        readout = root.find_element(By.CSS_SELECTOR, ".mha-hv-readout").text
    assert hover_none == touch and shown == [True, False]
    if touch:
        assert readout.startswith("Tap a token") and "tap again to release" in readout and "Hover" not in readout
    else:
        assert readout.startswith("Hover a token") and "click to pin" in readout
