"""The benchmark is not a timed test: this only proves that it runs (its smoke configuration), writes what the shipped
recording holds, and that --only-head-view replaces that part of a recording alone. Notebook 07's sentences about the
recorded run are checked in tests/test_benchmark_claims.py."""

import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"


def shape(results: dict) -> dict:
    """The structure of a results file, without the numbers and the lengths T chosen."""
    rows = lambda table: {mode: sorted({n for row in by_T.values() for n in row}) for mode, by_T in table.items()}  # noqa: E731
    return {
        "top": sorted(results), "machine": sorted(results["machine"]), "config": sorted(results["config"]),
        "impls": results["impls"], "time_s": rows(results["time_s"]), "decode_s": sorted(results["decode_s"]),
        "one time": sorted(next(iter(results["time_s"]["forward"].values()))["reference"]),
        "peak_bytes": {mode: sorted(row) for mode, row in results["peak_bytes"].items()},
        "head_view": {name: sorted(row) for name, row in results["head_view"].items()},
        "targets": [sorted(row) for row in results["targets"]],
    }


def run(*args):
    r = subprocess.run([sys.executable, SCRIPT, "--threads", "1", *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_the_smoke_run_prints_every_table_writes_the_recordings_fields_and_remeasures_the_head_view_apart(tmp_path):
    out = run("--smoke", "--json", tmp_path / "r.json")
    for heading in ("## Time: forward", "## Time: forward+backward", "## Decoding", "## Decode step",
                    "## Peak memory", "## Head view display (case C16)", "## Targets", "## Cross-attention"):
        assert heading in out, heading
    # The recorded run that ships with the package (notebook 07 plots it, in Colab too) is a full run with every
    # field the script writes today.
    smoke = json.loads((tmp_path / "r.json").read_text())
    recorded = json.loads(importlib.resources.files("mha").joinpath("data/benchmark_results.json").read_text())
    assert smoke["config"]["smoke"] and not recorded["config"]["smoke"] and shape(recorded) == shape(smoke)
    assert list(recorded["time_s"]["forward"]) == [str(T) for T in recorded["config"]["lengths"]]
    assert set(smoke["decode_step_s"]) == {"768", "64"}  # the decode step at both sizes, three implementations
    for row in smoke["decode_step_s"].values():
        assert {"minimal", "mha KVCache(max_len)", "mha KVCache()"} <= set(row) and len(row["round_ratios"]) == 1
    assert list(smoke["head_view"]) == ["GPT-2 small, one sentence", "12 heads, 512 tokens"]
    for row in smoke["head_view"].values():
        assert set(row["bytes"]) == {"text/html", "text/plain"} and row["total_bytes"] == sum(row["bytes"].values())
    targets = [row["target"].split(" ")[0] for row in smoke["targets"]]
    assert targets.count("decode") == 2 and targets.count("head") == 3
    sizes = [(row["layers"], row["h"], row["T"]) for row in recorded["head_view"].values()]
    assert sizes == [(12, 12, 24), (1, 12, 512)]  # the recorded run measures the sizes of case C16

    run("--only-head-view", "--json", tmp_path / "r.json", "--output", tmp_path / "r.md")
    after = json.loads((tmp_path / "r.json").read_text())
    kept = ["machine", "config", "time_s", "decode_s", "decode_step_s", "peak_bytes"]
    assert {k: after[k] for k in kept} == {k: smoke[k] for k in kept}
    assert after["head_view"] != smoke["head_view"] and shape(after) == shape(smoke)
    others = lambda res: [t for t in res["targets"] if not t["target"].startswith("head view")]  # noqa: E731
    assert others(after) == others(smoke)
    report = (tmp_path / "r.md").read_text()
    assert "Measured apart from the tables above (`--only-head-view`)" in report and "## Decode step" in report
