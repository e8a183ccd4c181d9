"""Notebook 03's experiments, over 10 seeds and up to 15,000 steps: too slow for a notebook, so they run here.

    python experiments/heads_sweep.py                                  # 51 minutes on 2 busy cores (below)
    python experiments/heads_sweep.py --smoke --json /tmp/smoke.json   # seconds: proves that it runs
    python experiments/heads_sweep.py --only nouns --json /tmp/n.json  # some groups only
    python experiments/heads_sweep.py --seeds 0 1 --json /tmp/s.json   # some seeds only

The full sweep writes ``mha/data/heads_sweep.json``, which ships inside the package, so notebook 03 plots it
wherever it opens, Colab included, through ``importlib.resources``; the notebook trains seed 1 of the main runs
(h = 1 and 4) live. ``tests/test_heads_claims.py`` checks every count notebook 03 states against the file, and that the
notebook's live models are the file's; ``tests/test_experiment.py`` reruns part of the sweep and checks that it
reproduces the file.

Every run is notebook 03's model (heads_task.py): one attention layer, d_model 32, Adam at lr 1e-2 on batches
of 128 sentences, each sentence seen once, and the same 2,000 test sentences. Seeds 0-9 set the initial
weights; the sentences are the same for every seed. The groups of runs:

* ``main``: h = 1, 2, 4, 3,000 steps, test accuracy every 25 steps to 300 and every 100 after. At step 300
  (the notebook's budget) and 3,000: the pronoun's mean weight per head on each relation's word; at step 300
  for h = 4: the accuracy with every subset of heads removed (zeroed W_O blocks), on the test set and on a
  separate validation set (pruning picks its order on the validation set and is scored on the test set).
* ``mask``: 300 steps with a plain causal mask (a word may attend to itself) instead of the notebook's.
* ``one relation``: h = 1, 300 steps, every readout asked for the same relation: one job at a time.
* ``nouns``: h = 1 and 4 with 2 or 6 nouns per pronoun instead of 24; h = 4 for 300 steps, h = 1 for 3,000 (one
  head is the one that gains from training), measured, with its weights, at steps 300 and 3,000 only: in between,
  where a curve is steep, another CPU's rounding shifts it by up to 0.23 (tests/test_experiment.py).
* ``lr``: h = 1 and 4, 300 steps, at lr 3e-3 and 3e-2.
* ``longer``: h = 1, 15,000 steps (50 times the budget): is one head still short of four heads? Its first 3,000
  steps are the ``main`` run's, number for number.

Run time, as measured on 2 cores shared with other work, 2 workers: seeds 0-4 (90 runs) in 1,050 s at load 5,
seeds 5-9 (90 runs, ``--seeds 5 6 7 8 9``) in 2,054 s at load 11; the shipped file joins the two (its ``wall_s`` is
their sum). Each run depends only on its settings and its seed, so one run of all 10 seeds gives the same runs.
The 15,000-step runs take the longest (157 s each at load 5, 270-390 s at load 11).

Each worker process uses one thread, as the notebook does: the matrices are tiny, one thread is the fastest,
and training repeats bit for bit on one machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

import torch

import heads_task as task

SEEDS = tuple(range(10))
STEPS, LONG_STEPS, LONGER_STEPS = 300, 3000, 15000
HEADS = (1, 2, 4)
OUTPUT = Path(__file__).resolve().parents[1] / "mha" / "data" / "heads_sweep.json"


GROUPS = ("longer", "main", "mask", "one relation", "nouns", "lr")


def plan(seeds=SEEDS, steps=STEPS, long_steps=LONG_STEPS, longer_steps=LONGER_STEPS, groups=GROUPS):
    """Every run, as a dict of its settings; the longest first, so that two workers finish together."""
    base = {"steps": steps, "lr": 1e-2, "mask": "look back", "nouns": 24, "relation": None}
    runs = [base | {"group": "longer", "h": 1, "seed": s, "steps": longer_steps} for s in seeds]
    runs += [base | {"group": "main", "h": h, "seed": s, "steps": long_steps} for h in HEADS for s in seeds]
    runs += [base | {"group": "mask", "h": h, "seed": s, "mask": "causal"} for h in HEADS for s in seeds]
    runs += [base | {"group": "one relation", "h": 1, "seed": s, "relation": r} for r in range(3) for s in seeds]
    runs += [base | {"group": "nouns", "h": h, "seed": s, "nouns": n, "steps": long_steps if h == 1 else steps}
             for n in (2, 6) for h in (1, 4) for s in seeds]
    runs += [base | {"group": "lr", "h": h, "seed": s, "lr": lr} for lr in (3e-3, 3e-2) for h in (1, 4) for s in seeds]
    return [run for run in runs if run["group"] in groups]


def measure_points(steps, long_steps):
    """Every 25 steps up to the notebook's budget, every 100 after it (proportionally fewer in a smoke run)."""
    short = max(1, steps // 12)
    return sorted(set(range(short, steps + 1, short)) | set(range(steps, long_steps + 1, 100)) | {long_steps})


_DATA: dict = {}  # per worker: (n_nouns, training steps) -> (train, test, validation), made once


def data(n_nouns, steps):
    """Enough training sentences for ``steps`` steps, and the test and validation sets, with n_nouns nouns.

    The training sentences come from one generator, in order, so the first n of a longer set are the n of a
    shorter one: every run sees the same sentences in the same order, however many it needs.
    """
    key = (n_nouns, steps)
    if key not in _DATA:
        full = _DATA.get(24)
        if full is None or len(full[0][0]) < steps * task.BATCH:
            _DATA.clear()  # a longer run: make its sentences (the shorter sets are their first rows)
            full = _DATA[24] = (task.make_data(steps * task.BATCH, task.TRAIN_SEED),
                                task.make_data(2000, task.TEST_SEED), task.make_data(2000, task.VALIDATION_SEED))
        train = tuple(t[: steps * task.BATCH] for t in full[0])
        _DATA[key] = tuple(task.fewer_nouns(d, n_nouns) if n_nouns != 24 else d for d in (train, *full[1:]))
    return _DATA[key]


def rounded(t: torch.Tensor):
    """4 decimals: exact for accuracies on 2,000 sentences (multiples of 0.0005), and enough for mean weights."""
    return [round(float(a), 4) for a in t.flatten()] if t.dim() == 1 else [rounded(row) for row in t]


def run(spec):
    """Train one model as ``spec`` says; return the spec with its results."""
    long_steps, steps = spec.pop("long_steps"), spec.pop("budget")
    train, test, validation = data(spec["nouns"], spec["steps"])
    if spec["relation"] is not None:
        train, test = (task.one_relation(d, spec["relation"]) for d in (train, test))
    longer = spec["steps"] > steps  # with its weights at the budget, at 3,000 and at the end
    if spec["group"] in ("main", "longer"):  # the curves notebook 03 draws
        points = measure_points(steps, spec["steps"])
    else:
        points = sorted({steps, spec["steps"]})  # the budget and the end
    keep_at = {steps, long_steps} & set(range(1, spec["steps"]))
    start = time.perf_counter()
    model, curve, kept = task.train(spec["h"], spec["seed"], train, test, steps=spec["steps"], lr=spec["lr"],
                                    mask=task.MASKS[spec["mask"]], measure_at=points, keep_at=keep_at)
    result = spec | {"curve": {str(step): rounded(acc) for step, acc in curve.items()}}
    if longer:
        at = kept | {spec["steps"]: model}
        result["weights"] = {str(step): rounded(task.relation_weights(m, test)) for step, m in sorted(at.items())}
        if spec["group"] == "main" and spec["h"] == 4:
            result["removed"] = removed_heads(kept[steps], test, validation)
    result["train_s"] = round(time.perf_counter() - start, 1)
    return result


def removed_heads(model, test, validation):
    """{"0,2": {"test": (3,), "validation": (3,)}, ...}: the accuracy with each subset of heads removed."""
    heads = range(model.attn.h)
    out = {}
    for k in range(len(heads) + 1):
        for gone in itertools.combinations(heads, k):
            pruned = task.without_heads(model, gone)
            out[",".join(map(str, gone))] = {"test": rounded(task.accuracy(pruned, test)),
                                             "validation": rounded(task.accuracy(pruned, validation))}
    return out


def _set_threads(threads):
    torch.set_num_threads(threads)


def sweep(seeds=SEEDS, steps=STEPS, long_steps=LONG_STEPS, longer_steps=LONGER_STEPS, groups=GROUPS, workers=2,
          threads=1, progress=print):
    runs = plan(seeds, steps, long_steps, longer_steps, groups)
    for spec in runs:
        spec |= {"long_steps": long_steps, "budget": steps}
    results = []
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no thread pool inherited from this one
    with ctx.Pool(workers, initializer=_set_threads, initargs=(threads,)) as pool:
        for result in pool.imap_unordered(run, runs):
            results.append(result)
            progress(f"[{len(results):3d}/{len(runs)}] {describe(result)}")
    order = {key(spec): i for i, spec in enumerate(plan(seeds, steps, long_steps, longer_steps, groups))}
    return sorted(results, key=lambda r: order[key(r)])


def key(spec):
    return tuple(spec[k] for k in ("group", "h", "seed", "mask", "nouns", "relation", "lr"))


def setting(r):
    """What sets a run apart from the notebook's: "3000 steps", "mask causal", "2 nouns", "lr 0.03"..."""
    if r["group"] == "one relation":
        return f"only {task.RELATIONS[r['relation']]}"
    return {"main": f"{r['steps']} steps", "longer": f"{r['steps']} steps", "mask": f"mask {r['mask']}",
            "nouns": f"{r['nouns']} nouns", "lr": f"lr {r['lr']:g}"}[r["group"]]


def describe(r):
    final = r["curve"][str(r["steps"])]
    return (f"{r['group']:12s} h={r['h']} seed {r['seed']} {setting(r):18s} "
            + "  ".join(f"{name} {a:.2f}" for name, a in zip(task.RELATIONS, final)) + f"  ({r['train_s']} s)")


def summary(results, steps):
    """Mean [min, max] over seeds of the final test accuracies, per setting: the table the notebook states."""
    groups: dict = {}
    for r in sorted(results, key=lambda r: r["group"] == "longer"):  # the longest runs last, after "main"
        if r["group"] in ("main", "longer"):  # the notebook's budget, and the long ones
            for step in dict.fromkeys([str(steps), str(r["steps"])]):
                groups.setdefault(f"h={r['h']}, {step} steps", []).append(r["curve"][step])
        elif r["steps"] > steps:  # fewer nouns, one head: at the budget and at the end
            for step in (steps, r["steps"]):
                groups.setdefault(f"h={r['h']}, {setting(r)}, {step} steps", []).append(r["curve"][str(step)])
        else:
            groups.setdefault(f"h={r['h']}, {setting(r)}", []).append(r["curve"][str(r["steps"])])
    lines = [f"{'setting':34s}" + "".join(f"{name:>20s}" for name in task.RELATIONS)]
    for name, accs in groups.items():
        acc = torch.tensor(accs)
        lines.append(f"{name:34s}" + "".join(
            f"{m:8.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in zip(acc.mean(0), acc.min(0).values, acc.max(0).values)))
    return "\n".join(lines)


def machine(workers, threads):
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "workers": workers, "threads per worker": threads}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=OUTPUT, help=f"where to write the results (default {OUTPUT})")
    parser.add_argument("--workers", type=int, default=2, help="processes; each trains one model at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (1, as the notebook)")
    parser.add_argument("--smoke", action="store_true", help="one seed, a few steps: proves that it runs")
    parser.add_argument("--seeds", nargs="+", type=int, default=SEEDS, metavar="SEED",
                        help="initial-weight seeds (default 0-9); the file then has only them")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=GROUPS, metavar="GROUP",
                        help=f"run only these groups of runs ({', '.join(GROUPS)}); the file then has only them")
    args = parser.parse_args(argv)
    setting = {"seeds": (0,), "steps": 24, "long_steps": 48, "longer_steps": 96} if args.smoke else {}
    setting.setdefault("seeds", tuple(args.seeds))
    start = time.perf_counter()
    results = sweep(**setting, groups=tuple(args.only), workers=args.workers, threads=args.threads)
    wall = time.perf_counter() - start
    steps = setting.get("steps", STEPS)
    config = {"smoke": args.smoke, "seeds": list(setting.get("seeds", SEEDS)), "steps": steps,
              "long_steps": setting.get("long_steps", LONG_STEPS),
              "longer_steps": setting.get("longer_steps", LONGER_STEPS), "batch": task.BATCH, "d_model": 32,
              "test sentences": 2000, "validation sentences": 2000,
              "sentence seeds": {"train": task.TRAIN_SEED, "test": task.TEST_SEED,
                                 "validation": task.VALIDATION_SEED},
              "relations": task.RELATIONS}
    out = {"about": __doc__.split("\n\n")[0], "config": config, "machine": machine(args.workers, args.threads),
           "wall_s": round(wall, 1), "runs": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(summary(results, steps))
    print(f"{len(results)} runs in {wall:.0f} s with {args.workers} workers; written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
