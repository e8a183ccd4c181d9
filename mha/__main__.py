"""python -m mha: the article's walk-through, headless."""

import argparse
import sys

from .walkthrough import walkthrough


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line and exit code 2, no usage dump or traceback
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(prog="python -m mha", description=__doc__)
    parser.add_argument("--d-model", type=int, default=32, help="embedding width (default 32)")
    parser.add_argument("--heads", type=int, default=4, help="number of heads h (default 4)")
    parser.add_argument("--batch", type=int, default=2, help="batch size B (default 2)")
    parser.add_argument("--tokens", type=int, default=6, help="sequence length T (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        lines = walkthrough(args.d_model, args.heads, args.batch, args.tokens, args.seed)
    except ValueError as err:
        parser.error(str(err))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
