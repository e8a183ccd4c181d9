"""The benchmark is not a timed test: CI only proves that it runs, in its smoke configuration."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"


def test_benchmark_smoke_runs_and_prints_every_table(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(tmp_path / "r.json"), "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    headings = ["## Time: forward", "## Time: forward+backward", "## Decoding", "## Decode step", "## Peak memory",
                "## Targets"]
    for heading in headings:
        assert heading in r.stdout
    assert "reference" in r.stdout and "mha fused" in r.stdout and "torch weights" in r.stdout
    results = json.loads((tmp_path / "r.json").read_text())
    # the decode step at both sizes, three implementations, and its two targets
    assert set(results["decode_step_s"]) == {"768", "64"}
    for row in results["decode_step_s"].values():
        assert {"minimal", "mha KVCache(max_len)", "mha KVCache()"} <= set(row) and len(row["round_ratios"]) == 1
    assert sum(row["target"].startswith("decode step") for row in results["targets"]) == 2
