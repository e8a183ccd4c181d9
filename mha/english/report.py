"""Notebook 06's printed tables and its figure of heads forming, made from the scores that ship, so that the chapter
shows the evidence and not the code that lays it out. Each function returns the table as text; the notebook prints it.

The runs are the ten seeds (``"0"`` to ``"9"``) and the control run trained without repeated passages
(``"seed0_norepeat"``). ``tests/test_english_claims.py`` checks the tables against ``scores.json`` and
``forming.json`` by its own reading of them.
"""

from __future__ import annotations

import math

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


def training(shipped: dict, n_tokens: int) -> str:
    """How every run was trained, three lines: its steps, batch and window (from each run's record in ``shipped``
    and the model's config), how many times each of the ``n_tokens`` training tokens was seen on average; the
    learning rate's warm-up (:data:`mha.english.train.WARMUP` steps) and cosine, as :func:`mha.english.train.lr_at`
    gives them for the recorded lr and floor;
    and the loss of guessing uniformly over the vocabulary, ln(vocab_size).

    Raises:
        ValueError: the runs were not all trained with the same steps, batch, learning rate and floor (names them).
    """
    from .train import WARMUP, lr_at

    kept = ("steps", "batch", "lr", "lr_floor")
    settings = {run: tuple(r["training"][k] for k in kept) for run, r in runs(shipped).items()}
    if len(set(settings.values())) != 1:
        raise ValueError(f"the runs were not trained alike ({', '.join(kept)}): {settings}")
    steps, batch, lr, floor = next(iter(settings.values()))
    context, vocab = shipped["config"]["context"], shipped["config"]["vocab_size"]
    return "\n".join([
        f"every run: {steps:,} steps of AdamW on {batch} windows of {context} tokens (each training token seen "
        f"{steps * batch * context / n_tokens:.0f} times)",
        f"learning rate: up to {lr:g} over the first {WARMUP} steps, then a cosine down to "
        f"{lr_at(steps, steps, lr, floor=floor):.0e} at step {steps:,}",
        f"guessing uniformly among the vocabulary's {vocab:,} words costs ln {vocab:,} = {math.log(vocab):.2f} nats"])


def patterns(score: dict) -> str:
    """Each pattern of :data:`measure.PATTERNS`: its viewpoint, its pairs (and those with a control) and uniform,
    from one run's ``{pattern: Score}`` on one book."""
    rows = [f"{'pattern':<36} {'viewpoint':<18} {'pairs in 2 Samuel':>17}  {'with a control':>14}  uniform"]
    for name, (viewpoint, _) in measure.PATTERNS.items():
        s = score[name]
        control = f"{s.n_control:,}" if s.control is not None else "-"
        rows.append(f"{name:<36} {viewpoint:<18} {s.n:>17,}  {control:>14}  {s.uniform:.3f}")
    return "\n".join(rows)


def _mark(v: dict, name: str) -> str:
    """One seed's verdict on one pattern: u (a distance pattern passes against uniform), or b and c (passes against
    the baseline, the control), '.' where it fails."""
    if name in measure.DISTANCES:
        return "u" if v["by_base"] else "."
    return ("b" if v["by_base"] else ".") + ("" if v["by_control"] is None else "c" if v["by_control"] else ".")


def _median(values: list) -> float:
    return sorted(values)[(len(values) - 1) // 2]  # the lower middle of an even count, as torch.median gives it


def verdicts(shipped: dict) -> str:
    """Per pattern: each seed's verdict on its chosen head (:func:`_mark`); in how many seeds it passes against
    the baseline (or uniform), the control and both; the median over seeds of the chosen head's weight on the
    key, the baseline (uniform for a distance) and the control; and the largest of the chosen heads' weights on
    the key."""
    seeds = list(shipped["seeds"])
    rows = [f"{'':<36}{'seed (verdict of its chosen head)':<{4 * len(seeds)}}   seeds passing       median         max",
            f"{'pattern':<36}" + "".join(f"{s:<4}" for s in seeds) + f"{'b':>4}{'c':>4}{'both':>6}   "
            f"{'key':>5}{'base':>6}{'ctrl':>6}{'key':>7}"]
    for name in measure.PATTERNS:
        vs = [shipped["seeds"][s]["verdicts"][name] for s in seeds]
        has_control = vs[0]["control"] is not None
        by_control = f"{sum(v['by_control'] for v in vs)}" if has_control else "-"
        control = f"{_median([v['control'] for v in vs]):.2f}" if has_control else "-"
        rows.append(f"{name:<36}" + "".join(f"{_mark(v, name):<4}" for v in vs)
                    + f"{sum(v['by_base'] for v in vs):>4}{by_control:>4}{sum(v['found'] for v in vs):>6}   "
                    f"{_median([v['raw'] for v in vs]):>5.2f}{_median([v['base'] for v in vs]):>6.2f}{control:>6}"
                    f"{max(v['raw'] for v in vs):>7.2f}")
    rows += ["", "b: the chosen head passes the bar against the same-distance baseline; c: against the same-class",
             "control; '.': it does not; u: a distance pattern passes against uniform attention, its one comparison",
             "(counted under b and both), which its 'base' column shows; max key: the most weight any seed's chosen",
             "head puts on the key"]
    return "\n".join(rows)


def bar(v: dict) -> float:
    """The least weight on the key that passes :func:`measure.passes` against both of a verdict's comparisons."""
    return max(max(measure.TIMES * a, a + measure.ABOVE) for a in (v["base"], v["control"]) if a is not None)


def readings(shipped: dict) -> str:
    """Each run's loss on the first and second reading of a passage and after natural context, the savings, and
    its chosen copying head's weight on the copy target against the bar (three decimals: seeds fall close to it)."""
    rows = [f"{'seed':<14} {'first reading':>13} {'second':>7} {'after natural':>14}   second reading cheaper:"
            "   copying head:",
            f"{'':<14} {'':>13} {'':>7} {'context':>14}   {'than first':>10} {'than natural':>12}"
            f"   {'weight':>7} {'bar':>6}"]
    for run, r in runs(shipped).items():
        loss, v = r["score_losses"], r["verdicts"]["copying (induction)"]
        rows.append(f"{run_name(run):<14} {loss['first_reading']:>13.2f} {loss['second_reading']:>7.2f} "
                    f"{loss['natural_context']:>14.2f}   {loss['first_reading'] - loss['second_reading']:>10.2f} "
                    f"{loss['natural_context'] - loss['second_reading']:>12.2f}   {v['raw']:>7.3f} {bar(v):>6.3f}")
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


# Okabe-Ito, a palette colour-blind readers can tell apart
BLUE, ORANGE, GREEN, VERMILION, GREY = "#0072B2", "#E69F00", "#009E73", "#D55E00", "#999999"


def plot_forming(shipped: dict, forming: dict, panels):
    """Notebook 06's figure of heads forming: one panel per ``(pattern, title)`` of ``panels``, then the second
    reading's saving, each against the training step.

    In a pattern's panel: each seed's finally chosen head's weight on the key at every checkpoint (thin) and their
    median (bold), with the median same-distance baseline (dashed) and same-class control (dash-dot), or uniform
    attention (dotted) for a distance pattern. In the last: nats a word the second reading saves against natural
    context, each seed, their median, and the run without repeated passages (black, dashed).

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt
    import torch

    seeds, steps = list(shipped["seeds"]), forming["runs"]["0"]["steps"]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(6, 3 * (len(panels) + 1)), sharex=True, layout="constrained")
    for ax, (name, title) in zip(axes, panels):
        heads = {s: shipped["seeds"][s]["chosen"][name] for s in seeds}  # each seed's head, chosen at the end
        raws = torch.tensor([at_steps(forming, s, name, "raw", heads[s]) for s in seeds])  # (seeds, checkpoints)
        ax.plot(steps, raws.T, color=ORANGE, lw=0.8, alpha=0.6)
        ax.plot(steps, raws.median(0).values, color=VERMILION, lw=2.4,
                label="weight on the key: each seed, and the median")
        if name in measure.DISTANCES:
            uniform = forming["runs"]["0"]["scores"][name]["uniform"]
            ax.axhline(uniform, color=GREY, ls=":", lw=2, label="uniform attention")
        else:
            for kind, colour, ls, label in (("base", BLUE, "--", "same-distance baseline (median)"),
                                            ("control", GREEN, "-.", "same-class control (median)")):
                median = torch.tensor([at_steps(forming, s, name, kind, heads[s]) for s in seeds]).median(0).values
                ax.plot(steps, median, color=colour, ls=ls, lw=2, label=label)
        ax.set_title(title)
        ax.set_ylabel("attention weight")
        ax.set_ylim(0, None)
    handles = {label: h for ax in axes[:-1] for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="outside upper center", ncols=1)
    ax = axes[-1]
    losses = {s: forming["runs"][s]["losses"] for s in [*seeds, "seed0_norepeat"]}
    saved = {s: torch.tensor(x["natural_context"]) - torch.tensor(x["second_reading"]) for s, x in losses.items()}
    ax.plot(steps, torch.stack([saved[s] for s in seeds]).T, color=ORANGE, lw=0.8, alpha=0.6)
    ax.plot(steps, torch.stack([saved[s] for s in seeds]).median(0).values, color=VERMILION, lw=2.4,
            label="each seed, and the median")
    ax.plot(steps, saved["seed0_norepeat"], color="black", lw=2, ls="--", label="seed 0 trained without repeats")
    ax.axhline(0, color=GREY, lw=1)
    ax.set_title("second reading: nats saved against natural context")
    ax.set_ylabel("nats")
    ax.set_xlabel("training step (16 windows of 128 words)")
    ax.legend(loc="upper left")
    return fig
