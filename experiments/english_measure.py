"""Measure the heads of notebook 06's trained models and ship what it reads: weights (fp16), scores.json, forming.json.

    python experiments/english_measure.py --runs runs/english             # after experiments/english_train.py
    python experiments/english_measure.py --runs runs/english --forming   # and the checkpoints: forming.json

For every run in ``--runs`` (``seed<S>.pt`` for the seeds of ``mha.english.SCORED_SEEDS``, and the control
``seed0_norepeat.pt``), on both held-out books: every pattern's per-head scores with both controls
(``mha.english.measure.head_scores``), the losses, the head chosen per pattern on the choosing book (1 Samuel), and
its verdicts on the scoring book (2 Samuel) by the bar of ``mha.english.measure.passes``. Weights ship for
``mha.english.SEEDS`` only (what keeps the wheel under 6 MB); the other seeds ship their scores. The training
entry records the log, and whether the run converged: the loss on 2 Samuel at the checkpoints of steps 9,500 to
12,000 (every 500) moves by less than 0.02 nats.

``--forming`` also measures every checkpoint ``seed<S>_step<N>.pt`` on 2 Samuel (previous word, copying, noun ->
determiner, object -> verb: raw, baseline and control per head; the four losses) into ``forming.json``. Each model
measured is kept in ``<runs>/measured/`` and reused while it is newer than the model's file, so the script can be
rerun as runs finish.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import time

import torch

from mha import english
from mha.english import measure
from mha.english.model import WordLM

OUT = os.path.join(os.path.dirname(__file__), "..", "mha", "data", "english")
FORMING = ("previous word", "copying (induction)", "noun -> its determiner", "object -> its verb")
LAST_FIFTH = tuple(range(9500, 12001, 500))  # the checkpoints of the last fifth of 12,000 steps (9,600 on), and 9,500
CONVERGED = 0.02  # nats: the most the loss on 2 Samuel may move over LAST_FIFTH


def load_run(path):
    state = torch.load(path, weights_only=True)
    model = WordLM(**english.CONFIG)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def ship(path, to):
    """Save the run's weights as the 0.5 model holds them (fp16): loading them into it checks the 0.4 layer's
    ``_extra_state`` entries (h, n_kv_heads, d_k) the training saved, and drops them."""
    state = load_run(path).state_dict()
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, to)


def rounded(losses):
    return {k: round(v, 4) for k, v in losses.items()}


def measure_final(path):
    """Everything measured on a trained model: both books, every pattern, the chosen heads and their verdicts."""
    model, itos, text = load_run(path), list(english.vocabulary()), english.heldout()
    out = {}
    for part, book in (("choose", english.CHOOSE_BOOK), ("score", english.SCORE_BOOK)):
        piece = text.part(book)
        scores = measure.head_scores(model, piece, itos)
        out[part] = {name: s.as_dict() for name, s in scores.items()}
        out[part + "_losses"] = rounded(measure.losses(model, piece, itos))
        if part == "choose":
            chosen = {name: measure.best_head(s, name) for name, s in scores.items()}
            out["chosen"] = {name: list(h) for name, h in chosen.items()}
    out["verdicts"] = {name: {k: round(v, 4) if isinstance(v, float) else v for k, v in
                              measure.verdict(measure.Score.from_dict(out["score"][name]), name, head).items()}
                       for name, head in chosen.items()}
    return out


def measure_checkpoint(path):
    """The forming scores of one checkpoint on 2 Samuel: the patterns of FORMING and the four losses."""
    model, itos = load_run(path), list(english.vocabulary())
    piece = english.heldout().part(english.SCORE_BOOK)
    scores = measure.head_scores(model, piece, itos, names=FORMING)
    return dict(score={name: s.as_dict() for name, s in scores.items()},
                losses=rounded(measure.losses(model, piece, itos)))


def cached(job):
    """Run ``job = (function name, model path, cache path)`` unless the cache is newer than the model."""
    kind, path, cache = job
    if os.path.exists(cache) and os.path.getmtime(cache) > os.path.getmtime(path):
        with open(cache) as f:
            return json.load(f)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    out = (measure_final if kind == "final" else measure_checkpoint)(path)
    with open(cache, "w") as f:
        json.dump(out, f)
    print(f"{os.path.basename(path)}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def run_all(jobs, workers):
    if workers == 1:
        return [cached(j) for j in jobs]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return list(pool.map(cached, jobs))


def checkpoints(runs, name):
    """{step: path} of the run's checkpoints, in order."""
    found = {int(m.group(1)): os.path.join(runs, f) for f in os.listdir(runs)
             if (m := re.fullmatch(rf"{name}_step(\d+)\.pt", f))}
    return dict(sorted(found.items()))


def forming_entry(steps, measured):
    """One run's forming scores, one list entry per step: per pattern raw, base and control per head (12 numbers,
    layer by layer), 3 decimals; the losses, 4."""
    flat = lambda t: None if t is None else [round(v, 3) for row in t for v in row]  # noqa: E731
    scores = {name: {kind: [flat(m["score"][name][kind]) for m in measured] for kind in ("raw", "base", "control")}
              for name in FORMING}
    for name in FORMING:
        scores[name]["uniform"] = measured[0]["score"][name]["uniform"]
    losses = {k: [m["losses"][k] for m in measured] for k in measured[0]["losses"]}
    return dict(steps=steps, scores=scores, losses=losses)


def convergence(steps, measured):
    text = {s: m["losses"]["text"] for s, m in zip(steps, measured) if s in LAST_FIFTH}
    if set(text) != set(LAST_FIFTH):
        return None
    moved = max(text.values()) - min(text.values())
    return dict(steps=list(LAST_FIFTH), loss_on_2_samuel=[text[s] for s in LAST_FIFTH], moved=round(moved, 4),
                converged=moved < CONVERGED)


def about():
    unshipped = [s for s in english.SCORED_SEEDS if s not in english.SEEDS]
    return ("Per head (layers x heads, counted from 0) and per pattern: raw = mean weight on the pattern's key, "
            "base = the same head's mean weight at the same distance, control = the same-class control (the mean "
            "weight from a word of the query's part of speech to another word of the key's at the same distance; "
            "for copying, the same positions after natural context), uniform = 1/(i+1); on 1 Samuel (choose) and "
            "2 Samuel (score), windows of 128 tokens. 'chosen' is each pattern's head with the largest raw - base on "
            "1 Samuel, 'verdicts' its numbers on 2 Samuel and whether it passes the bar (at least twice and 0.1 "
            "above) against each. Made by experiments/english_measure.py."
            + (f" Weights ship for seeds {', '.join(map(str, english.SEEDS))} only; seeds "
               f"{', '.join(map(str, unshipped))} were trained with the same script and settings, and these are the "
               "scores measured on their weights, which do not ship." if unshipped else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs/english")
    ap.add_argument("--forming", action="store_true", help="also measure every checkpoint into forming.json")
    ap.add_argument("--workers", type=int, default=1, help="processes (1 thread each)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cache = os.path.join(a.runs, "measured")
    os.makedirs(cache, exist_ok=True)
    names = {f"seed{s}": ("seeds", str(s)) for s in english.SCORED_SEEDS} | {"seed0_norepeat": ("control",
                                                                                               "seed0_norepeat")}
    missing = [n for n in names if not os.path.exists(os.path.join(a.runs, f"{n}.pt"))]
    if missing:
        raise SystemExit(f"not trained yet: {', '.join(missing)}")
    steps = {n: checkpoints(a.runs, n) for n in names}
    wanted = {n: (s if a.forming else {k: v for k, v in s.items() if k in LAST_FIFTH}) for n, s in steps.items()}
    jobs = [("final", os.path.join(a.runs, f"{n}.pt"), os.path.join(cache, f"{n}.json")) for n in names]
    jobs += [("checkpoint", p, os.path.join(cache, f"{n}_step{k}.json")) for n in names for k, p in wanted[n].items()]
    measured = dict(zip([j[2] for j in jobs], run_all(jobs, a.workers)))

    result = dict(about=about(), config=english.CONFIG, patterns={k: list(v) for k, v in measure.PATTERNS.items()},
                  bar=dict(times=measure.TIMES, above=measure.ABOVE), seeds={}, control={})
    forming = dict(about=f"Scores at checkpoints on {english.SCORE_BOOK}, per run: raw, base and control per head "
                         "(12 numbers, layer 0's heads first), uniform, and the losses (text, first and second "
                         "reading of a passage, the passage after natural context). Made by "
                         "experiments/english_measure.py --forming.", book=english.SCORE_BOOK, runs={})
    for name, (where, key) in names.items():
        with open(os.path.join(a.runs, f"{name}.json")) as f:
            log = json.load(f)
        entry = measured[os.path.join(cache, f"{name}.json")]
        at = list(wanted[name])
        marks = [measured[os.path.join(cache, f"{name}_step{k}.json")] for k in at]
        entry["training"] = dict(seed=log["args"]["seed"], steps=log["steps_done"], seconds=log["seconds"],
                                 repeat=log["args"]["repeat"], batch=log["args"]["batch"], lr=log["args"]["lr"],
                                 lr_floor=log["args"]["lr_floor"], final_loss=round(log["log"][-1][1], 4),
                                 log=[[s, round(loss, 4)] for s, loss, _ in log["log"]],
                                 convergence=convergence(at, marks))
        result[where][key] = entry
        if a.forming:
            forming["runs"][key] = forming_entry(at, marks)
        if where == "seeds" and int(key) in english.SEEDS:
            ship(os.path.join(a.runs, f"{name}.pt"), os.path.join(OUT, f"weights_{name}.pt"))
    with open(os.path.join(OUT, "scores.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    if a.forming:
        with open(os.path.join(OUT, "forming.json"), "w") as f:
            json.dump(forming, f, separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
