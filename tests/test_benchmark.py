"""The benchmark is not a timed test: CI only proves that it runs, in its smoke configuration."""

import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"


def shape(results: dict) -> dict:
    """The structure of a results file, without the numbers and the lengths T chosen."""
    def keys_per_T(table):
        return {mode: sorted({name for row in by_T.values() for name in row}) for mode, by_T in table.items()}

    return {
        "top": sorted(results),
        "machine": sorted(results["machine"]),
        "config": sorted(results["config"]),
        "impls": results["impls"],
        "time_s": keys_per_T(results["time_s"]),
        "one time": sorted(next(iter(results["time_s"]["forward"].values()))["reference"]),
        "decode_s": sorted(results["decode_s"]),
        "peak_bytes": {mode: sorted(row) for mode, row in results["peak_bytes"].items()},
        "head_view": {name: sorted(row) for name, row in results["head_view"].items()},
        "targets": [sorted(row) for row in results["targets"]],
    }


@pytest.mark.slow
def test_benchmark_smoke_runs_and_prints_every_table(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(tmp_path / "r.json"), "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    headings = ["## Time: forward", "## Time: forward+backward", "## Decoding", "## Decode step", "## Peak memory",
                "## Head view display (case C16)", "## Targets"]
    for heading in headings:
        assert heading in r.stdout
    assert "reference" in r.stdout and "mha fused" in r.stdout and "torch weights" in r.stdout

    # The recorded run that ships with the package (notebook 07 plots it, in Colab too) is a full
    # run with every field the script writes today.
    smoke = json.loads((tmp_path / "r.json").read_text())
    recorded = json.loads(importlib.resources.files("mha").joinpath("data/benchmark_results.json").read_text())
    assert smoke["config"]["smoke"] and not recorded["config"]["smoke"]
    assert shape(recorded) == shape(smoke)
    assert list(recorded["time_s"]["forward"]) == [str(T) for T in recorded["config"]["lengths"]]
    results = json.loads((tmp_path / "r.json").read_text())
    # the decode step at both sizes, three implementations, and its two targets
    assert set(results["decode_step_s"]) == {"768", "64"}
    for row in results["decode_step_s"].values():
        assert {"minimal", "mha KVCache(max_len)", "mha KVCache()"} <= set(row) and len(row["round_ratios"]) == 1
    assert sum(row["target"].startswith("decode step") for row in results["targets"]) == 2
    # the head view's display (case C16) at its two sizes, its bytes as stored, and its three targets
    assert list(results["head_view"]) == ["GPT-2 small, one sentence", "12 heads, 512 tokens"]
    for row in results["head_view"].values():
        assert set(row["bytes"]) == {"text/html", "text/plain"} and row["total_bytes"] == sum(row["bytes"].values())
    assert sum(row["target"].startswith("head view") for row in results["targets"]) == 3
    sizes = [(row["layers"], row["h"], row["T"]) for row in recorded["head_view"].values()]
    assert sizes == [(12, 12, 24), (1, 12, 512)]  # the recorded run measures the sizes of case C16


@pytest.mark.slow
def test_only_the_head_view_is_measured_into_a_recorded_run(tmp_path):
    """--only-head-view replaces the head view's numbers and targets in a recorded run, keeps the rest as it was
    measured, and the report says that the head view was measured apart (and when)."""
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(tmp_path / "r.json"), "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    before = json.loads((tmp_path / "r.json").read_text())
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--only-head-view", "--json", str(tmp_path / "r.json"), "--threads", "1",
         "--output", str(tmp_path / "r.md")],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    after = json.loads((tmp_path / "r.json").read_text())
    kept = ["machine", "config", "time_s", "decode_s", "decode_step_s", "peak_bytes"]
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert after["head_view"] != before["head_view"] and shape(after) == shape(before)
    assert [t for t in after["targets"] if not t["target"].startswith("head view")] == [
        t for t in before["targets"] if not t["target"].startswith("head view")]
    report = (tmp_path / "r.md").read_text()
    assert "Measured apart from the tables above (`--only-head-view`)" in report and "## Decode step" in report
