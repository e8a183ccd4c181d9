import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# "ci" is reproducible (derandomized) so a CI run can be repeated exactly;
# HYPOTHESIS_PROFILE=dev explores new random examples on every run.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_addoption(parser):
    # tests/test_colab.py runs every notebook in a fresh venv, as Colab would: minutes, so CI asks for it.
    parser.addoption("--colab", action="store_true", help="also run every notebook as in Colab (tests/test_colab.py)")
