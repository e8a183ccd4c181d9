"""Notebook 05's ten seeds (experiments/induction_seeds.py) and the results that ship with the package.

Notebook 05 trains seeds 0 to 2 live and reads seeds 3 to 9 from ``mha/data/induction_seeds.json``; the rates it
states ("9 of 10 seeds") count all ten. These tests check that the module the script runs is the notebook's code,
that the shipped file holds what the notebook's prose says, and, by retraining, that the file is what that code
gives: seed 7 (the seed that fails, both models) in the ordinary run, seeds 3 to 9 with ``--experiment`` (seeds 0
to 2 the notebook itself retrains, and strict nbval compares what it prints with the stored rows, which
``test_the_notebook_live_seeds_print_what_the_shipped_file_holds`` checks against this file).

How close is close enough? On the recording machine a rerun is identical, number for number. Rerun there with
PyTorch's and MKL's AVX2 kernels instead of AVX-512 (``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``,
seeds 0, 4 and 7, all three models), the largest change in any number was 7.9e-6 (the eval loss of seed 0, h = 1);
TOLERANCE is a hundred times that, still far below the two decimals the notebook prints.
"""

import ast
import importlib.resources
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import induction_seeds  # noqa: E402

import induction_task as task  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "05_heads_specialise.ipynb"
SHIPPED = json.loads(importlib.resources.files("mha").joinpath("data/induction_seeds.json").read_text())
TOLERANCE = 1e-3  # largest accepted |rerun - shipped| for any float (measured: 7.9e-6 with AVX2 kernels, see above)
SAME_AS_THE_NOTEBOOK = ["make_batch", "Block", "TinyTransformer", "head_scores", "repeat_loss", "train", "solved_at",
                        "attention_with_ablation", "forward_with_ablation"]


def key(run):
    return run["seed"], run["h"], run["n_layers"]


SHIPPED_RUNS = {key(r): r for r in SHIPPED["runs"]}


def definitions(source):
    """name -> the code of every top-level function and class in `source`, normalised by ast."""
    return {node.name: ast.unparse(node) for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def test_the_module_is_the_notebook_code():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    notebook = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            notebook.update(definitions("".join(cell["source"])))
    module = definitions(Path(task.__file__).read_text())
    for name in SAME_AS_THE_NOTEBOOK:
        assert module[name] == notebook[name], f"{name} in experiments/induction_task.py is not notebook 05's"
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for setting in ("V, T = 26, 20", "L_MIN, L_MAX = 4, 10", "STEPS = 500"):
        assert setting in text
    assert (task.V, task.T, task.L_MIN, task.L_MAX, task.STEPS) == (26, 20, 4, 10, 500)
    assert "manual_seed(1))  # a fixed evaluation set" in text and task.EVAL_SEED == 1


def test_the_shipped_results_are_ten_seeds_of_three_models():
    config = SHIPPED["config"]
    assert config["seeds"] == list(range(10)) and config["steps"] == 500
    assert sorted(SHIPPED_RUNS) == sorted((s, h, n) for s in range(10) for h, n in induction_seeds.MODELS)
    evaluation = task.Evaluation()
    assert abs(config["guess_seen"] - evaluation.guess_seen) < 1e-12 and config["guess_all"] == evaluation.guess_all


def counts():
    """What notebook 05 counts over the ten seeds: claim -> the seeds in which it fails."""
    four = {s: SHIPPED_RUNS[s, 4, 2] for s in range(10)}
    one = {s: SHIPPED_RUNS[s, 1, 2] for s in range(10)}
    layer = {s: SHIPPED_RUNS[s, 4, 1] for s in range(10)}
    guess = SHIPPED["config"]["guess_seen"]

    def fails(runs, claim):
        return [s for s, r in runs.items() if not claim(r)]

    return {
        "plateau above guessing among the letters seen": fails(four, lambda r: r["plateau"] > guess),
        "solved": fails(four, lambda r: r["loss"] < 0.05 and r["accuracy"] > 0.98),
        "previous-token head > 0.85": fails(four, lambda r: r["prev"] > 0.85),
        "induction head > 0.8": fails(four, lambda r: r["induction"] > 0.8),
        "two or more induction heads": fails(four, lambda r: r["n_induction"] >= 2),
        "habit fades inside the repeat": fails(four, lambda r: r["inside"] < 0.6),
        "either layer costs > 2 nats": fails(four, lambda r: min(r["layer_1"], r["layer_2"]) > 2),
        "no layer-2 head costs > 0.5": fails(four, lambda r: r["max_l2"] < 0.5),
        "costliest head is the previous-token head": fails(four, lambda r: r["costliest"]),
        "h = 1 solved": fails(one, lambda r: r["loss"] < 0.05 and r["accuracy"] > 0.98),
        "h = 1 previous-token then induction": fails(one, lambda r: r["prev"] > 0.85 and r["induction"] > 0.8),
        "h = 1 no later than h = 4": [s for s in range(10) if one[s]["solved"] > four[s]["solved"]],
        "one layer not solved": fails(layer, lambda r: r["loss"] > 1 and r["accuracy"] < 0.5),
        "one layer below guessing among the letters seen": fails(layer, lambda r: r["loss"] < guess),
    }


def test_the_rates_and_failures_the_notebook_states():
    assert counts() == {
        "plateau above guessing among the letters seen": [], "solved": [7], "previous-token head > 0.85": [7],
        "induction head > 0.8": [7], "two or more induction heads": [], "habit fades inside the repeat": [],
        "either layer costs > 2 nats": [], "no layer-2 head costs > 0.5": [7],
        "costliest head is the previous-token head": [4], "h = 1 solved": [],
        "h = 1 previous-token then induction": [7], "h = 1 no later than h = 4": [], "one layer not solved": [],
        "one layer below guessing among the letters seen": [],
    }
    # The numbers the prose gives for seed 7, and the ranges it gives over the ten seeds, at the printed precision.
    r7, c7 = SHIPPED_RUNS[7, 4, 2], SHIPPED_RUNS[7, 1, 2]
    assert [f"{r7[k]:.2f}" for k in ("loss", "accuracy", "prev", "induction", "max_l2")] == ["0.52", "0.87", "0.77",
                                                                                            "0.69", "1.01"]
    assert r7["n_induction"] == 2 and r7["solved"] == 500 and c7["solved"] == 325
    assert [f"{c7[k]:.2f}" for k in ("prev", "induction", "loss")] == ["0.84", "0.91", "0.01"]
    assert all(SHIPPED_RUNS[s, h, 2]["solved"] < SHIPPED_RUNS[7, h, 2]["solved"] for s in range(7) for h in (4, 1))
    layer = [SHIPPED_RUNS[s, 4, 1] for s in range(10)]
    assert f"{min(r['loss'] for r in layer):.2f} {max(r['loss'] for r in layer):.2f}" == "2.06 2.20"
    assert f"{min(r['accuracy'] for r in layer):.0%} {max(r['accuracy'] for r in layer):.0%}" == "26% 29%"
    cost = [SHIPPED_RUNS[s, 4, 2]["prev_cost"] for s in range(10)]
    assert f"{min(cost):.1f} {max(cost):.1f}" == "0.2 3.6"


def rerun_matches_shipped(seed, h, n_layers):
    torch.set_num_threads(1)
    rerun, _, _ = task.run(seed, h=h, n_layers=n_layers)
    shipped = SHIPPED_RUNS[seed, h, n_layers]
    assert set(rerun) == set(shipped)
    for name, value in rerun.items():
        if isinstance(value, float):
            assert abs(value - shipped[name]) <= TOLERANCE, (seed, h, n_layers, name, value, shipped[name])
        else:
            assert value == shipped[name], (seed, h, n_layers, name, value, shipped[name])


@pytest.mark.slow
@pytest.mark.parametrize("h", [4, 1])
def test_seed_7_retrains_to_the_shipped_numbers(h):
    rerun_matches_shipped(7, h, 2)


@pytest.mark.slow
@pytest.mark.experiment
@pytest.mark.parametrize("seed", range(3, 10))
def test_every_seed_the_notebook_reads_retrains_to_the_shipped_numbers(seed):
    for h, n_layers in induction_seeds.MODELS:
        rerun_matches_shipped(seed, h, n_layers)


def test_the_notebook_live_seeds_print_what_the_shipped_file_holds():
    """The live-against-shipped comparison: the rows notebook 05 stored for seeds 0-2, trained in the notebook, are
    the shipped file's numbers at the notebook's precision."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = ["".join(c["source"]).rstrip() for c in cells]
    (live,) = [c for c, text in zip(cells, code) if c["cell_type"] == "code" and text.endswith("show_seeds(LIVE)")]
    printed = "".join("".join(o["text"]) for o in live["outputs"] if o.get("name") == "stdout").splitlines()
    for seed in range(3):
        for h in (4, 1):
            r = SHIPPED_RUNS[seed, h, 2]
            row = (f"{h}   {seed:>4}  {r['loss']:4.2f}  {r['accuracy']:5.2f}  {r['plateau']:7.1f}  {r['solved']:7d} | "
                   f"{r['prev']:4.2f}  {r['inside']:9.2f}  {r['induction']:9.2f} {r['n_induction']} |")
            if h == 4:
                row += f" {r['layer_1']:7.1f}  {r['layer_2']:7.1f}  {r['prev_cost']:4.2f}  {r['max_l2']:8.2f}"
            assert row in printed, (seed, h, row)
        c = SHIPPED_RUNS[seed, 4, 1]
        assert f"    seed {seed}: eval loss {c['loss']:.2f}, right {c['accuracy']:.2f}" in printed
