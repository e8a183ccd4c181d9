"""Notebook 05's training over 10 seeds, ahead of time: the rates that notebook 05 states come from here.

    python experiments/induction_seeds.py                          # 30 models, about 5 minutes on 2 busy cores
    python experiments/induction_seeds.py --seeds 0 7 --json /tmp/s.json   # some seeds only

It writes ``mha/data/induction_seeds.json``, which ships inside the package, so notebook 05 reads it wherever it
opens, Colab included, through ``importlib.resources``. Each seed sets the initial weights and the training
batches (induction_task.run) of three models trained for 500 steps, as in the notebook: two layers with h = 4
(the notebook's model), two layers with h = 1 (its one-head-per-layer control) and one layer with h = 4 (the
control for "one layer has no direct way to solve this"); each run keeps its measurements and the mean training loss
of every 10 steps, which the notebook draws for all ten seeds. The notebook trains seed 0's two-layer models live;
``tests/test_induction_seeds.py`` reruns some seeds and compares them with the shipped file.

One thread per process, as in the notebook: the matrices are tiny, and training repeats bit for bit on one machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path

import torch

import induction_task as task

SEEDS = tuple(range(10))
MODELS = ((4, 2), (1, 2), (4, 1))  # (h, n_layers): the notebook's model, one head per layer, one layer
OUT = Path(__file__).resolve().parents[1] / "mha" / "data" / "induction_seeds.json"


def one(job):
    seed, h, n_layers = job
    torch.set_num_threads(1)
    result, _, _ = task.run(seed, h=h, n_layers=n_layers)
    print(f"seed {seed}, h={h}, {n_layers} layer(s): loss {result['loss']:.2f}", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--json", type=Path, default=OUT)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    jobs = [(seed, h, n_layers) for seed in args.seeds for h, n_layers in MODELS]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        runs = pool.map(one, jobs, chunksize=1)
    evaluation = task.Evaluation()
    results = {
        "config": {"seeds": args.seeds, "steps": task.STEPS, "batch": 64, "lr": 3e-3, "eval_sequences": 1000,
                   "models": [{"h": h, "n_layers": n} for h, n in MODELS],
                   "guess_all": evaluation.guess_all, "guess_seen": evaluation.guess_seen},
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "python": sys.version.split()[0]},
        "wall_s": round(time.perf_counter() - start),
        "runs": runs,
    }
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json} ({len(runs)} runs, {results['wall_s']} s)")


if __name__ == "__main__":
    main()
