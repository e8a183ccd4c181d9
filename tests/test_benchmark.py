"""The benchmark is not a timed test: CI only proves that it runs, in its smoke configuration."""

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
    for heading in ["## Time: forward", "## Time: forward+backward", "## Decoding", "## Peak memory", "## Targets"]:
        assert heading in r.stdout
    assert "reference" in r.stdout and "mha fused" in r.stdout and "torch weights" in r.stdout
    assert (tmp_path / "r.json").stat().st_size > 0
