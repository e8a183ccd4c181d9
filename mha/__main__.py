"""python -m mha: the article's walk-through, headless. Sizes that would need more than 1 GiB are refused."""

import argparse
import sys

from .walkthrough import memory_needed, walkthrough

SEED_MAX = 2**64 - 1  # torch.manual_seed takes 0 .. 0xffff_ffff_ffff_ffff (and remaps negatives: we refuse them)
# A walk-through to read, not a benchmark: sizes that need more memory than this are refused before anything is
# allocated (case C21: --tokens 5000 took 10.8 GiB, larger sizes died inside the allocator).
BUDGET = 2**30  # bytes, 1 GiB


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line and exit code 2, no usage dump or traceback
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_in(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high]; argparse names the option in the error."""
    what = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


def main(argv=None) -> int:
    parser = _Parser(prog="python -m mha", description=__doc__)
    parser.add_argument("--d-model", type=_int_in(1), default=32, help="embedding width (default 32)")
    parser.add_argument("--heads", type=_int_in(1), default=4, help="number of heads h (default 4)")
    parser.add_argument("--batch", type=_int_in(1), default=2, help="batch size B (default 2)")
    parser.add_argument("--tokens", type=_int_in(1), default=6, help="sequence length T (default 6)")
    parser.add_argument("--seed", type=_int_in(0, SEED_MAX), default=0,
                        help=f"random seed, 0 to {SEED_MAX} (default 0)")
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        divisors = [h for h in range(1, min(args.d_model, 64) + 1) if args.d_model % h == 0]
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}: each head gets "
                     f"d_model / h dimensions (try --heads in {divisors})")
    over_budget = _over_budget(args)
    if over_budget:
        parser.error(over_budget)
    lines = walkthrough(args.d_model, args.heads, args.batch, args.tokens, args.seed)
    print("\n".join(lines))
    return 0


def _over_budget(args) -> str | None:
    """Why these sizes are refused (what they would need, and the largest that fits), or None if they fit."""
    sizes = {"d_model": args.d_model, "h": args.heads, "B": args.batch, "T": args.tokens}
    need = memory_needed(**sizes)
    if need <= BUDGET:
        return None
    fits = [f"{option} {n}" for option, name in (("--tokens", "T"), ("--batch", "B"))
            if (n := _largest_fitting(sizes, name))]
    fits = fits or [f"--d-model {n}" for n in [_largest_fitting(sizes, "d_model")] if n]  # the weights are too big
    if fits:
        hint = f"; with the other options as they are, at most {' or '.join(fits)} fits"
    else:  # not even d_model = h, one dimension per head
        smallest = memory_needed(**{**sizes, "d_model": args.heads})
        hint = (f"; nothing fits with --heads {args.heads}: even the smallest width, --d-model {args.heads}, "
                f"would need about {_gib(smallest)}; use fewer --heads")
    return (f"--d-model {args.d_model} --heads {args.heads} --batch {args.batch} --tokens {args.tokens} would "
            f"need about {_gib(need)} of memory, more than the {_gib(BUDGET)} this walk-through allows{hint}")


def _largest_fitting(sizes: dict, name: str) -> int:
    """The largest value of one size (0 if none) that fits the budget with the others unchanged; d_model stays a
    multiple of h."""
    step = sizes["h"] if name == "d_model" else 1
    low, high = 0, 1  # memory_needed grows with each size: double, then bisect (in multiples of step)
    while memory_needed(**{**sizes, name: high * step}) <= BUDGET:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if memory_needed(**{**sizes, name: mid * step}) <= BUDGET else (low, mid)
    return low * step


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


if __name__ == "__main__":
    sys.exit(main())
