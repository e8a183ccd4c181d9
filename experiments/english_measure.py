"""Measure the heads of notebook 06's trained models and ship them: weights (fp16) and scores.json.

    python experiments/english_measure.py --runs runs/english      # after experiments/english_train.py
    python experiments/english_measure.py --runs runs/english2 --add 3 4     # more seeds: their scores only

For every seed (and the control trained without repeated passages), on both held-out books: every pattern's
per-head scores (mha.english.measure.head_scores), the losses, and the head chosen per pattern on the choosing
book (1 Samuel), to be read on the scoring book. Weights ship for ``mha.english.SEEDS`` only (the 2 MB cap holds
three); ``--add`` measures more seeds' runs and adds their scores to the shipped scores.json, leaving every entry
already there as it is and copying no weights.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import time

import torch

from mha import english
from mha.english import measure
from mha.english.model import WordLM

OUT = os.path.join(os.path.dirname(__file__), "..", "mha", "data", "english")


def load_run(path):
    state = torch.load(path, weights_only=True)
    model = WordLM(**english.CONFIG)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def measure_model(path):
    """Everything measured on the model saved at ``path`` (one process per model: they run in parallel)."""
    torch.set_num_threads(1)
    model, itos, text = load_run(path), list(english.vocabulary()), english.heldout()
    out = {}
    for part, book in (("choose", english.CHOOSE_BOOK), ("score", english.SCORE_BOOK)):
        piece = text.part(book)
        scores = measure.head_scores(model, piece, itos)
        out[part] = {name: s.as_dict() for name, s in scores.items()}
        out[part + "_losses"] = {k: round(v, 4) for k, v in measure.losses(model, piece, itos).items()}
        if part == "choose":
            out["chosen"] = {name: list(measure.best_head(s, name)) for name, s in scores.items()}
    return out


def about(seeds):
    unshipped = [s for s in seeds if s not in english.SEEDS]
    return ("Per head (layers x heads, counted from 0) and per pattern: raw = mean weight on the pattern's key, "
            "base = the same head's mean weight at the same distance, uniform = 1/(i+1); on 1 Samuel (choose) and "
            "2 Samuel (score), windows of 128 tokens. 'chosen' is each pattern's head with the largest raw - base on "
            "1 Samuel. Made by experiments/english_measure.py."
            + (f" Weights ship for seeds {', '.join(map(str, english.SEEDS))} only (the 2 MB cap holds three); seeds "
               f"{', '.join(map(str, unshipped))} were trained with the same script and settings, and these are the "
               "scores measured on their weights, which do not ship (added with --add)." if unshipped else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs/english")
    ap.add_argument("--add", type=int, nargs="+", metavar="SEED",
                    help="measure these seeds' runs and add their scores (not their weights) to scores.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if a.add:
        if set(a.add) & set(english.SEEDS):
            raise SystemExit(f"--add is for seeds whose weights do not ship; {english.SEEDS} are measured without it")
        result = english.shipped_scores()
        runs = {f"seed{s}": ("seeds", str(s)) for s in a.add}
    else:
        result = dict(about="", config=english.CONFIG, patterns={k: list(v) for k, v in measure.PATTERNS.items()},
                      seeds={}, control={})
        runs = {f"seed{s}": ("seeds", str(s)) for s in english.SEEDS}
        runs["seed0_norepeat"] = ("control", "seed0_norepeat")
    with concurrent.futures.ProcessPoolExecutor(len(runs)) as pool:
        measured = dict(zip(runs, pool.map(measure_model, [os.path.join(a.runs, f"{n}.pt") for n in runs])))
    for name, (where, key) in runs.items():
        with open(os.path.join(a.runs, f"{name}.json")) as f:
            log = json.load(f)
        entry = measured[name]
        entry["training"] = dict(seed=log["args"]["seed"], steps=log["steps_done"], seconds=log["seconds"],
                                 repeat=log["args"]["repeat"], batch=log["args"]["batch"], lr=log["args"]["lr"],
                                 final_loss=round(log["log"][-1][1], 4),
                                 log=[[s, round(loss, 4)] for s, loss, _ in log["log"]])
        result[where][key] = entry
        if where == "seeds" and not a.add:
            shutil.copyfile(os.path.join(a.runs, f"{name}.pt"), os.path.join(OUT, f"weights_{name}.pt"))
        print(f"{name}: measured ({time.perf_counter() - t0:.0f} s)", flush=True)
    result["seeds"] = dict(sorted(result["seeds"].items(), key=lambda kv: int(kv[0])))
    result["about"] = about(sorted(int(s) for s in result["seeds"]))
    with open(os.path.join(OUT, "scores.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
