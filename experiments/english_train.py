"""Train notebook 06's model for one seed and save its weights (fp16) and its training log.

    nice -n 10 python experiments/english_train.py --seed 0 --out runs/english            # one process per seed
    for s in 0 1 2; do nice -n 10 python experiments/english_train.py --seed $s & done     # the shipped three

1 thread per process (on 2 shared cores, 2 threads were slower per step than 1). The weights go to
``<out>/seed<S>[_norepeat].pt`` (checkpoints ``..._step<N>.pt`` on the way) and the log to ``<out>/seed<S>.json``.
``experiments/english_measure.py`` then measures the heads and writes the scores that ship.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mha.english import data
from mha.english.model import WordLM
from mha.english.train import train

DEFAULTS = dict(vocab_size=2500, d_model=64, h=4, layers=3, context=128, mlp=4)
# Dense early, where the heads form, then every 500 steps: experiments/english_measure.py --forming reads them.
CHECKPOINTS = [0, 100, 200, 300, 400, 500, 700, 1000, 1200, 1500, *range(2000, 12001, 500)]


def fp16_state(model):
    return {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--repeat", type=float, default=0.5, help="share of windows with a passage repeated")
    ap.add_argument("--lr-floor", type=float, default=0.01, help="the cosine ends at lr * lr_floor")
    ap.add_argument("--max-seconds", type=float, default=3300, help="wall-clock cap, checked every 100 steps")
    ap.add_argument("--stop-after", type=int, default=None, help="stop after this step (to repeat a capped run)")
    ap.add_argument("--checkpoints", type=int, nargs="*", default=CHECKPOINTS,
                    help="steps after which to save the weights (multiples of 100; 0 is the initialisation)")
    ap.add_argument("--out", default="runs/english")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    name = f"seed{a.seed}" + ("" if a.repeat > 0 else "_norepeat")
    t0 = time.perf_counter()
    words = data.train_words()
    itos = data.vocabulary(words, DEFAULTS["vocab_size"])
    ids = data.encode(words, itos)
    print(f"{len(ids):,} tokens, vocabulary {len(itos)}, <unk> {float((ids == 0).float().mean()):.4f}, "
          f"read in {time.perf_counter() - t0:.1f} s", flush=True)
    torch.manual_seed(a.seed)
    model = WordLM(**DEFAULTS)
    if 0 in a.checkpoints:
        torch.save(fp16_state(model), os.path.join(a.out, f"{name}_step0.pt"))

    def on_log(step, loss, seconds):
        print(f"{name} step {step} loss {loss:.3f} {seconds:.0f} s", flush=True)
        if step in a.checkpoints:
            torch.save(fp16_state(model), os.path.join(a.out, f"{name}_step{step}.pt"))

    log = train(model, ids, a.steps, seed=a.seed, batch_size=a.batch, lr=a.lr, repeat=a.repeat,
                lr_floor=a.lr_floor, max_seconds=a.max_seconds, stop_after=a.stop_after, on_log=on_log)
    torch.save(fp16_state(model), os.path.join(a.out, f"{name}.pt"))
    with open(os.path.join(a.out, f"{name}.json"), "w") as f:
        json.dump(dict(config=DEFAULTS, args=vars(a), steps_done=log[-1][0], seconds=round(log[-1][2], 1),
                       threads=1, log=log, unk=float((ids == 0).float().mean())), f)
    print(f"{name}: {log[-1][0]} steps in {log[-1][2]:.0f} s", flush=True)


if __name__ == "__main__":
    main()
