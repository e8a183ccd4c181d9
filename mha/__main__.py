"""python -m mha: the article's walk-through, headless."""

import argparse
import sys

from .walkthrough import walkthrough

SEED_MAX = 2**64 - 1  # torch.manual_seed takes 0 .. 0xffff_ffff_ffff_ffff (and remaps negatives: we refuse them)


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
    lines = walkthrough(args.d_model, args.heads, args.batch, args.tokens, args.seed)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
