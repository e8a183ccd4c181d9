"""Notebook 06's printed tables, made from the scores that ship, so that the chapter shows the evidence and not the
code that lays it out. Each function returns the table as text; the notebook prints it.

The runs are the ten seeds (``"0"`` to ``"9"``) and the control run trained without repeated passages
(``"seed0_norepeat"``). ``tests/test_english_claims.py`` checks the tables against ``scores.json`` and
``forming.json`` by its own reading of them.
"""

from __future__ import annotations

from . import measure

CONVERGED = 0.02  # nats: a run "converged" over a stretch of steps if its loss on 2 Samuel moved by less than this


def runs(shipped: dict) -> dict:
    """Every run's final scores: the ten seeds, then the control run, keyed as :mod:`mha.english` keys them."""
    return dict(shipped["seeds"]) | {"seed0_norepeat": shipped["control"]["seed0_norepeat"]}


def run_name(run: str) -> str:
    return run if run.isdigit() else "0, no repeats"


def moved(forming: dict, run: str, first: int) -> float:
    """How far the loss on 2 Samuel moved (largest minus smallest checkpoint) from step ``first`` to the end."""
    f = forming["runs"][run]
    losses = [loss for step, loss in zip(f["steps"], f["losses"]["text"]) if step >= first]
    return max(losses) - min(losses)


def convergence(shipped: dict, forming: dict, shipping: tuple[int, ...]) -> str:
    """Each run: whether its weights ship, its share of repeated windows, its final loss on 2 Samuel, and how far
    that loss moved over steps 9,500-12,000 and 10,000-12,000 (under :data:`CONVERGED` or not)."""
    rows = ["                               loss on 2 Samuel    it moved by, over steps     under 0.02 over",
            "seed           weights repeats at step 12,000    9,500-12,000  10,000-12,000     9,500   10,000"]
    for run, r in runs(shipped).items():
        m = [moved(forming, run, first) for first in (9_500, 10_000)]
        rows.append(f"{run_name(run):<14} {'ship' if run in map(str, shipping) else '-':>7} "
                    f"{r['training']['repeat']:>7.0%} {r['score_losses']['text']:>16.3f} {m[0]:>15.3f} {m[1]:>14.3f} "
                    f"{'yes' if m[0] < CONVERGED else 'no':>9} {'yes' if m[1] < CONVERGED else 'no':>8}")
    return "\n".join(rows)


def patterns(score: dict) -> str:
    """Each pattern of :data:`measure.PATTERNS`: its viewpoint, its pairs (and those with a control) and uniform,
    from one run's ``{pattern: Score}`` on one book."""
    rows = [f"{'pattern':<36} {'viewpoint':<18} {'pairs in 2 Samuel':>17}  {'with a control':>14}  uniform"]
    for name, (viewpoint, _) in measure.PATTERNS.items():
        s = score[name]
        control = f"{s.n_control:,}" if s.control is not None else "-"
        rows.append(f"{name:<36} {viewpoint:<18} {s.n:>17,}  {control:>14}  {s.uniform:.3f}")
    return "\n".join(rows)


def _cell(run: dict, name: str) -> str:
    v, (layer, head) = run["verdicts"][name], run["chosen"][name]
    control = "  -  " if v["control"] is None else f"{v['control']:.2f}"
    marks = ("b" if v["by_base"] else ".") + ("" if v["by_control"] is None else "c" if v["by_control"] else ".")
    return f"L{layer}.h{head} {v['raw']:.2f} {v['base']:.2f} {control} {marks:<2}"


def verdicts(shipped: dict) -> str:
    """Per seed and pattern, the chosen head's numbers and verdicts, five seeds a block; then, per pattern, in how
    many seeds it is found against the baseline, the control and both."""
    seeds, rows = list(shipped["seeds"]), []
    for group in (seeds[:5], seeds[5:]):
        rows.append(f"{'pattern':<36}" + "".join(f"  {f'seed {s}':<23}" for s in group))
        rows += [f"{name:<36}" + "".join(f"  {_cell(shipped['seeds'][s], name):<23}" for s in group)
                 for name in measure.PATTERNS]
        rows.append("")
    rows += ["each cell: the head chosen on 1 Samuel, then on 2 Samuel its weight on the key, the baseline "
             "(uniform for a distance) and the control;",
             "b: passes the bar against the baseline, c: against the control, "
             "'.': does not", "",
             f"{'pattern':<36} {'found against the baseline':>27} {'against the control':>20} "
             f"{'against both':>13}"]
    n = len(seeds)
    for name in measure.PATTERNS:
        vs = [shipped["seeds"][s]["verdicts"][name] for s in seeds]
        by_control = "-" if vs[0]["control"] is None else f"{sum(v['by_control'] for v in vs)} of {n}"
        rows.append(f"{name:<36} {sum(v['by_base'] for v in vs):>20} of {n} {by_control:>20} "
                    f"{sum(v['found'] for v in vs):>8} of {n}")
    return "\n".join(rows)


def readings(shipped: dict) -> str:
    """Each run's loss on the first and second reading of a passage and after natural context, and the savings."""
    rows = [f"{'seed':<14} {'first reading':>13} {'second':>7} {'after natural context':>22}   "
            "second reading cheaper by:",
            f"{'':<14} {'':>13} {'':>7} {'':>22}   {'than the first':>14} {'than natural context':>21}"]
    for run, r in runs(shipped).items():
        loss = r["score_losses"]
        rows.append(f"{run_name(run):<14} {loss['first_reading']:>13.2f} {loss['second_reading']:>7.2f} "
                    f"{loss['natural_context']:>22.2f}   {loss['first_reading'] - loss['second_reading']:>14.2f} "
                    f"{loss['natural_context'] - loss['second_reading']:>21.2f}")
    return "\n".join(rows)


def at_steps(forming: dict, run: str, name: str, kind: str, head) -> list:
    """One head's ``kind`` score (raw, base or control) for pattern ``name`` at every checkpoint of ``run``."""
    return [None if v is None else v[4 * head[0] + head[1]] for v in forming["runs"][run]["scores"][name][kind]]


def first_pass(shipped: dict, forming: dict, run: str, name: str) -> int | None:
    """The first checkpoint from which ``run``'s finally chosen head passes the bar against both comparisons, to the
    end of training; None if it never does."""
    head, scores = runs(shipped)[run]["chosen"][name], forming["runs"][run]["scores"][name]
    raw, base, control = (at_steps(forming, run, name, kind, head) for kind in ("raw", "base", "control"))
    against = [scores["uniform"] if name in measure.DISTANCES else b for b in base]
    ok = [measure.passes(r, a) and (c is None or measure.passes(r, c)) for r, a, c in zip(raw, against, control)]
    return next((step for i, step in enumerate(forming["runs"][run]["steps"]) if all(ok[i:])), None)


def first_passes(shipped: dict, forming: dict, names) -> str:
    """:func:`first_pass` for each pattern of ``names`` and each seed."""
    seeds = list(shipped["seeds"])
    rows = ["the first step from which each seed's chosen head passes the bar, to the end of training ('-': never)",
            f"{'pattern':<24}" + "".join(f"{s:>7}" for s in seeds)]
    rows += [f"{name:<24}" + "".join(f"{first_pass(shipped, forming, s, name) or '-':>7}" for s in seeds)
             for name in names]
    return "\n".join(rows)


def _scores(v: dict) -> str:
    control = "  - " if v["control"] is None else f"{v['control']:.2f}"
    return f"{v['raw']:.2f} / {v['base']:.2f} / {control} {'found' if v['found'] else '  -  '}"


def with_and_without(shipped: dict) -> str:
    """Seed 0 with and without repeated passages: per pattern, the chosen head's raw / baseline / control, found?"""
    with_, without = shipped["seeds"]["0"]["verdicts"], shipped["control"]["seed0_norepeat"]["verdicts"]
    rows = [f"{'pattern':<36} {'seed 0':>26} {'seed 0, no repeats':>26}",
            f"{'':<36} {'(the chosen head: raw / baseline / control, found?)':>53}"]
    rows += [f"{name:<36} {_scores(with_[name]):>26} {_scores(without[name]):>26}" for name in measure.PATTERNS]
    return "\n".join(rows)
