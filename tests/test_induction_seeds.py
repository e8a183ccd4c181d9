"""Notebook 05's ten seeds (experiments/induction_seeds.py) and the results that ship with the package.

Notebook 05 trains seed 0's four-head model live and reads all ten seeds of its three models from
``mha/data/induction_seeds.json``; the rates it states ("9 of 10 seeds") count all ten. These tests check that the
module the script runs is the notebook's code, that the notebook's prose states what the file holds, and, by
retraining, that the file is what that code gives: seed 7 (the seed that fails, both models) in the ordinary run,
every other model with ``--experiment`` (seed 0's four-head model the notebook itself retrains, and strict nbval
compares what it prints with the stored row, which ``test_the_notebook_live_seed_prints_what_the_shipped_file_holds``
checks against this file).

How close is close enough? On the recording machine a rerun is identical, number for number. Rerun there with
PyTorch's and MKL's AVX2 kernels instead of AVX-512 (``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``,
seeds 0, 4 and 7, all three models), the largest change in any number was 7.9e-6 (the eval loss of seed 0, h = 1);
TOLERANCE is a hundred times that, still far below the two decimals the notebook prints; the training curves (mean
losses of 10 steps, stored to 4 significant digits) get the same tolerance plus their rounding.
"""

import ast
import importlib.resources
import json
import re
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
        "either layer costs > 2 nats": fails(four, lambda r: min(r["layer_1"], r["layer_2"]) > 2),
        "no layer-2 head costs > 0.5": fails(four, lambda r: r["max_l2"] < 0.5),
        "costliest head is the previous-token head": fails(four, lambda r: r["costliest"]),
        "h = 1 solved": fails(one, lambda r: r["loss"] < 0.05 and r["accuracy"] > 0.98),
        "h = 1 previous-token then induction": fails(one, lambda r: r["prev"] > 0.85 and r["induction"] > 0.8),
        "one layer not solved": fails(layer, lambda r: r["loss"] > 1 and r["accuracy"] < 0.5),
        "one layer below guessing among the letters seen": fails(layer, lambda r: r["loss"] < guess),
    }


def test_the_rates_and_failures_the_notebook_states():
    assert counts() == {
        "plateau above guessing among the letters seen": [], "solved": [7], "previous-token head > 0.85": [7],
        "induction head > 0.8": [7], "either layer costs > 2 nats": [], "no layer-2 head costs > 0.5": [7],
        "costliest head is the previous-token head": [4], "h = 1 solved": [],
        "h = 1 previous-token then induction": [7], "one layer not solved": [],
        "one layer below guessing among the letters seen": [],
    }
    # What the prose says in numbers: seed 0's (the seed the notebook trains and looks at), seed 7's, the ranges.
    r7, c7 = SHIPPED_RUNS[7, 4, 2], SHIPPED_RUNS[7, 1, 2]
    layer = [SHIPPED_RUNS[s, 4, 1] for s in range(10)]
    cost = [SHIPPED_RUNS[s, 4, 2]["prev_cost"] for s in range(10)]
    r0 = SHIPPED_RUNS[0, 4, 2]
    stated(f"puts {r0['prev']:.2f} of its weight on the previous letter, and layer 2's best head {r0['induction']:.2f}",
           f"all {r0['n_induction']} became induction heads",
           f"(its lowest is {r0['plateau']:.1f} nats, against {SHIPPED['config']['guess_seen']:.2f}), as it does in"
           " 10 of 10 seeds", f"falls to {r0['loss']:.2f} nats, and the model names"
           f" {r0['accuracy']:.2f} of the letters", f"(layer 2, the cheaper: {r0['layer_2']:.2f})",
           f"in layer 1 ({r0['prev_cost']:.2f} nats)",
           f"single layer-2 head costs is {r0['max_l2']:.2f} nats, yet all of layer 2 costs {r0['layer_2']:.2f}",
           "solve the task in 9 of 10 seeds", f"with {r7['accuracy']:.0%} of the letters right",
           "more than 2 nats in 10 of 10 seeds",
           "more than 0.5 nats in 9 of 10", "costliest single head in 9 of 10 seeds",
           f"costs only {min(cost):.1f} nats",
           "solves the task in 10 of 10 seeds, with a previous-token head then an induction head in 9 of 10 (seed 7's"
           f" previous-token head reaches {c7['prev']:.2f})",
           f"none of the 10 seeds (eval loss {min(r['loss'] for r in layer):.2f} nats or more), though it ends below"
           f" guessing among the letters seen (at most {max(r['loss'] for r in layer):.2f} nats)",
           "in 9 of 10 seeds. With one layer it does not succeed in 500 steps in 10 of 10 seeds; with one head per"
           " layer and the same 10,778 parameters it succeeds in 10 of 10")


def test_no_head_does_either_job_before_training_in_any_seed():
    """What the summary calls learned: every seed's untrained four-head model, built as run() builds it, scores below
    0.5 on both jobs with every head, where the trained ones score above 0.85 and 0.8 (the shipped file)."""
    evaluation = task.Evaluation()
    torch.set_num_threads(1)
    highest = []
    for seed in range(10):
        torch.manual_seed(seed)
        with torch.no_grad():
            _, w = task.TinyTransformer(task.V, task.T)(evaluation.x)
        highest.append(max(float(s.max()) for s in task.head_scores(w, evaluation.rep)))
    trained = [min(SHIPPED_RUNS[s, 4, 2]["prev"], SHIPPED_RUNS[s, 4, 2]["induction"]) for s in range(10) if s != 7]
    assert max(highest) < 0.5 < min(trained)
    stated("before training every head's score was below 0.5, in 10 of 10 seeds")


def test_the_parameter_counts_the_notebook_states():
    size = {(h, n): sum(p.numel() for p in task.TinyTransformer(task.V, task.T, h=h, n_layers=n).parameters())
            for h, n in induction_seeds.MODELS}
    assert size[4, 2] == size[1, 2] > size[4, 1]
    stated(f"h = 1, one head of d_k = 32 per layer and the same {size[1, 2]:,} parameters",
           f"with h = 4 and {size[4, 1]:,} parameters")


def stated(*phrases):
    """Notebook 05's prose says each of these phrases (whitespace-insensitive)."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    prose = re.sub(r"\s+", " ", " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))
    assert not [p for p in phrases if p not in prose], [p for p in phrases if p not in prose]


def rerun_matches_shipped(seed, h, n_layers):
    torch.set_num_threads(1)
    rerun, _, _ = task.run(seed, h=h, n_layers=n_layers)
    shipped = SHIPPED_RUNS[seed, h, n_layers]
    assert set(rerun) == set(shipped)
    for name, value in rerun.items():
        if name == "curve":  # 10-step means, stored to 4 significant digits
            assert max(abs(a - b) - 5e-4 * abs(b) for a, b in zip(value, shipped[name])) <= TOLERANCE, (seed, h)
        elif isinstance(value, float):
            assert abs(value - shipped[name]) <= TOLERANCE, (seed, h, n_layers, name, value, shipped[name])
        else:
            assert value == shipped[name], (seed, h, n_layers, name, value, shipped[name])


@pytest.mark.slow
@pytest.mark.parametrize("h", [4, 1])
def test_seed_7_retrains_to_the_shipped_numbers(h):
    rerun_matches_shipped(7, h, 2)


@pytest.mark.slow
@pytest.mark.experiment
@pytest.mark.parametrize("seed", range(10))
def test_every_model_the_notebook_reads_retrains_to_the_shipped_numbers(seed):
    for h, n_layers in induction_seeds.MODELS:
        if (seed, h, n_layers) != (0, 4, 2):  # the notebook trains that one itself, under strict nbval
            rerun_matches_shipped(seed, h, n_layers)


def test_the_notebook_live_seed_prints_what_the_shipped_file_holds():
    """The live-against-shipped comparison: the row notebook 05 stored for seed 0, trained in the notebook, is the
    shipped file's, at the notebook's precision."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    printed = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code" for o in c["outputs"])
    (live,) = re.findall(r"^(4 +0 .*?) +<- trained above$", printed, re.M)
    r = SHIPPED_RUNS[0, 4, 2]
    assert live == (f"4   {0:>4}  {r['loss']:4.2f}  {r['accuracy']:5.2f}  {r['plateau']:7.1f}  {r['solved']:7d} | "
                    f"{r['prev']:4.2f}  {r['inside']:9.2f}  {r['induction']:9.2f} {r['n_induction']} | "
                    f"{r['layer_1']:7.1f}  {r['layer_2']:7.1f}  {r['prev_cost']:4.2f}  {r['max_l2']:8.2f}")
