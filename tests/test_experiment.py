"""Notebook 03's sweep (experiments/heads_sweep.py) and the results that ship with the package.

Notebook 03 shows the sweep's results over seeds 0-9, up to 15,000 steps, from ``mha/data/heads_sweep.json``, and
tests/test_heads_claims.py checks what its prose says about them. Here: the file is a full sweep, its runs are
consistent with each other, the script runs (the smoke test, seconds), and a rerun of part of the sweep reproduces
the file (``test_the_sweep_reproduces_the_shipped_results``, only with ``--experiment``, in one CI step).

Which part. The 10-seed sweep took 51 minutes on 2 shared cores (seeds 0-4: 1,050 s at load 5; seeds 5-9: 2,054 s at
load 11), too long for CI, whose whole run must stay under 30 minutes. CI reruns seeds 0 and 1 (RERUN_SEEDS), about
3 minutes of its time (it reran seeds 0-4 until the whole run passed 30 minutes): seed 1 is the one notebook 03
trains live for 300 steps, here with its 3,000- and 15,000-step runs too, and both are among the seeds whose rerun
with other CPU kernels measured the tolerances below, so a difference beyond those tolerances means a real change.
Seeds 2, 3 and 4 were part of that measurement too. Seeds 2-9 are trusted without a rerun in CI: they were recorded
by the same script, whose runs depend only on their settings and seed, on the same kind of machine (AMD EPYC, torch
2.13.0), which reproduced seeds 0 and 1 (h = 1, 2 and 4 at 300 steps) to the file's 4 decimals; the smoke test
proves the script still runs with every group and field. Seeds 5-9 were not rerun with other kernels, and one of
them is a run that a small change could tip: seed 9's one head with 6 nouns stays stuck near chance on two relations
(notebook 03, section 8), so the tolerances below would not cover a rerun of it on another CPU.

How close is close enough? On the machine that recorded the file, a rerun is identical, number for number. Another
CPU rounds differently (other vector kernels, other summation orders), and a small difference early in training
can grow. We measured how much, by rerunning the sweep's seeds 0-4 on the recording machine with PyTorch's and
MKL's AVX2 kernels instead of AVX-512 (``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``; the groups
``longer`` and ``nouns`` with ``--only longer nouns``). The largest changes, and the tolerances (about twice
those), are in TOLERANCE. The largest come in the middle of a steep stretch of a curve, which another CPU shifts by
a few steps; the numbers at the ends of the runs, which notebook 03 counts, move less.
"""

import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "heads_sweep.py"
SHIPPED = json.loads(importlib.resources.files("mha").joinpath("data/heads_sweep.json").read_text())

TOLERANCE = {  # kind of number -> largest accepted |rerun - shipped| (measured with AVX2 kernels, see above)
    "accuracy up to step 300": 0.02,  # measured 0.005
    "accuracy up to step 300 at lr 0.03": 0.15,  # measured 0.073: the largest learning rate diverges fastest
    "accuracy at step 3000 or 15000": 0.15,  # measured 0.077 (one head, 2 nouns, step 3,000): what notebook 03 counts
    "accuracy between, after step 300": 0.25,  # measured 0.114 (step 13,700): a steep stretch of a curve shifts
    "weights at step 300": 0.01,  # measured 0.0019
    "weights at step 3000": 0.25,  # measured 0.137 (one head, 2 nouns)
    "weights at step 15000": 0.02,  # measured 0.0037
    "accuracy with heads removed": 0.03,  # measured 0.012: a model with heads removed is off its training path
}
SETTINGS = ("group", "h", "seed", "steps", "lr", "mask", "nouns", "relation")
RERUN_SEEDS = (0, 1)  # see the docstring


def key(run):
    return tuple(run[k] for k in SETTINGS)


def differences(shipped, rerun):
    """{kind: (largest |difference|, where)} over every number of the shipped runs that were rerun."""
    largest = {kind: (0.0, None) for kind in TOLERANCE}

    def note(kind, a, b, where):
        d = max(abs(x - y) for x, y in zip(a, b))
        if d >= largest[kind][0]:
            largest[kind] = (d, where)

    budget, ends = shipped["config"]["steps"], (shipped["config"]["long_steps"], shipped["config"]["longer_steps"])
    for run in shipped["runs"]:
        if key(run) not in rerun:
            continue
        other = rerun[key(run)]
        for step, acc in run["curve"].items():
            kind = ("accuracy at step 3000 or 15000" if int(step) in ends else "accuracy between, after step 300"
                    if int(step) > budget else "accuracy up to step 300 at lr 0.03" if run["lr"] > 1e-2
                    else "accuracy up to step 300")
            note(kind, acc, other["curve"][step], (key(run), step))
        for step, rows in run.get("weights", {}).items():
            kind = f"weights at step {step}"
            for head, row in enumerate(rows):
                note(kind, row, other["weights"][step][head], (key(run), step, head))
        for gone, acc in run.get("removed", {}).items():
            for split in ("test", "validation"):
                note("accuracy with heads removed", acc[split], other["removed"][gone][split], (key(run), gone, split))
    return largest


def shape(results):
    """The structure of a results file, without the numbers: the fields, and which runs have what."""
    return {
        "top": sorted(results),
        "config": sorted(results["config"]),
        "run fields": sorted({tuple(sorted(r)) for r in results["runs"]}),
        "groups": sorted({(r["group"], r["h"], r["mask"], r["nouns"], r["relation"], r["lr"]) for r in results["runs"]},
                         key=str),
        "removed": sorted({len(r["removed"]) for r in results["runs"] if "removed" in r}),
    }


def run_sweep(tmp_path, *args):
    out = tmp_path / "sweep.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out), *args], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


def test_the_shipped_results_are_a_full_sweep():
    config = SHIPPED["config"]
    assert not config["smoke"] and config["seeds"] == list(range(10))
    assert (config["steps"], config["long_steps"], config["longer_steps"]) == (300, 3000, 15000)
    assert len({key(r) for r in SHIPPED["runs"]}) == len(SHIPPED["runs"]) == 180
    for run in SHIPPED["runs"]:
        assert str(run["steps"]) in run["curve"]
        long = run["group"] in ("main", "longer") or (run["group"] == "nouns" and run["h"] == 1)
        assert run["steps"] == {"main": 3000, "longer": 15000}.get(run["group"], 3000 if long else 300)
        if long:  # with the weights at the budget and at the end: what notebook 03 reads
            assert set(run["weights"]) == {"300", "3000", str(run["steps"])} and len(run["weights"]["300"]) == run["h"]
            drawn = run["group"] in ("main", "longer")  # curves measured along the way; fewer nouns at 300 and 3,000
            assert {"300", "1000", "3000"} <= set(run["curve"]) if drawn else set(run["curve"]) == {"300", "3000"}
        assert ("removed" in run) == (run["group"] == "main" and run["h"] == 4)


def test_the_longer_runs_continue_the_main_runs_number_for_number():
    # The sentences come in one order from one generator, so the first 3,000 steps of a 15,000-step run are the
    # 3,000-step run: a check that the sweep gives every run the same data, whatever its length.
    for longer in (r for r in SHIPPED["runs"] if r["group"] == "longer"):
        (main,) = [r for r in SHIPPED["runs"] if r["group"] == "main" and (r["h"], r["seed"]) == (1, longer["seed"])]
        assert {step: longer["curve"][step] for step in main["curve"]} == main["curve"]
        assert {step: longer["weights"][step] for step in main["weights"]} == main["weights"]


@pytest.mark.slow
def test_the_sweep_smoke_runs_and_writes_what_the_notebook_reads(tmp_path):
    smoke, printed = run_sweep(tmp_path, "--smoke", "--workers", "1")
    assert smoke["config"]["smoke"] and smoke["config"]["seeds"] == [0]
    assert shape(smoke) == shape(SHIPPED)
    assert "h=1, 24 steps" in printed and "h=4, mask causal" in printed and "h=1, only refers to" in printed


@pytest.mark.slow
@pytest.mark.experiment
def test_the_sweep_reproduces_the_shipped_results(tmp_path):
    rerun, printed = run_sweep(tmp_path, "--seeds", *map(str, RERUN_SEEDS))
    assert shape(rerun) == shape(SHIPPED)
    assert rerun["config"] == SHIPPED["config"] | {"seeds": list(RERUN_SEEDS)}
    assert len(rerun["runs"]) == len(SHIPPED["runs"]) * len(RERUN_SEEDS) // len(SHIPPED["config"]["seeds"])
    found = differences(SHIPPED, {key(r): r for r in rerun["runs"]})
    print(f"seeds {RERUN_SEEDS} rerun on {rerun['machine']['cpu']}, torch {rerun['machine']['torch']},"
          f" in {rerun['wall_s']} s;"
          f" shipped from {SHIPPED['machine']['cpu']}, torch {SHIPPED['machine']['torch']}")
    for kind, (d, where) in found.items():
        print(f"  {kind:36s} largest difference {d:.4f} (tolerance {TOLERANCE[kind]}) at {where}")
    assert all(d <= TOLERANCE[kind] for kind, (d, _) in found.items()), found
