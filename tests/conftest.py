import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# "ci" is reproducible (derandomized) so a CI run can be repeated exactly;
# HYPOTHESIS_PROFILE=dev explores new random examples on every run.
# A test that needs more examples asks for a multiple of the profile's (helpers.examples), so the profile governs.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# derandomize=False said explicitly: with CI set in the environment, hypothesis makes its own defaults
# derandomized, and a profile inherits the defaults.
settings.register_profile(
    "dev", derandomize=False, deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """One intra-op thread, for tests of tiny tensors (a module asks with pytestmark = usefixtures("one_thread")).

    Their operations gain nothing from a second thread, and on a shared 2-core machine each one then waits for the
    scheduler: a 5x5 tril took 30 ms, not 0.03, under load, which tripled the layer tests' time.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The website tests (tests/test_site.py) build the site and drive headless Chromium. They run with
# --site, which CONTRIBUTING.md's test command and CI pass; without it they are skipped, and say why.
def pytest_addoption(parser):
    parser.addoption("--site", action="store_true", help="build the website and test it in headless Chromium")
    # tests/test_colab.py runs every notebook in a fresh venv, as Colab would: minutes, so CI asks for it.
    parser.addoption("--colab", action="store_true", help="also run every notebook as in Colab (tests/test_colab.py)")
    # tests/test_experiment.py reruns notebook 03's sweep (minutes) and compares it with the shipped results: one CI
    # step asks for it.
    parser.addoption("--experiment", action="store_true",
                     help="also rerun notebook 03's sweep and compare it with mha/data/heads_sweep.json")
    # tests/test_packaging.py builds the sdist and wheel, checks them, and installs the wheel with only torch and
    # the declared dependencies into a fresh venv: a minute or two, so CI and the release workflow ask for it.
    parser.addoption("--package", action="store_true", help="also build, check and install the package in a fresh venv")


def pytest_configure(config):
    config.addinivalue_line("markers", "site: builds the website and drives headless Chromium (needs --site)")
    config.addinivalue_line("markers", "experiment: reruns an experiment whose results ship as package data"
                                       " (needs --experiment)")
    # The edit-and-test loop (CONTRIBUTING.md) leaves these out: python -m pytest -m "not slow" tests
    config.addinivalue_line("markers", "slow: takes more than a few seconds; -m 'not slow' leaves it out")
    # A user-reported case, C1 to C32, is a marker (c1 to c32), and its one-line fault is in the test's
    # docstring: python -m pytest -m c19 tests runs every test of case C19.
    for n in range(1, 33):
        config.addinivalue_line("markers", f"c{n}: a test of case C{n} (its fault in the test's docstring)")


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not config.getoption("--site"):
        skips["site"] = pytest.mark.skip(reason="website test: run with --site (needs the docs extra and Chromium)")
    if not config.getoption("--experiment"):
        skips["experiment"] = pytest.mark.skip(reason="reruns notebook 03's sweep (minutes): run with --experiment")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
