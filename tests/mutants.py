"""Mutation check: does our test suite notice the mistakes learners make?

Each mutant is one mistake of the bug zoo (tests/bug_zoo.py) applied as a small text edit to
a copy of the library. Run the suite on every mutant; a mutant the suite does not fail on is
a hole in the tests.

    python tests/mutants.py                          # every mutant, the current tests
    python tests/mutants.py --tests-from 5ba93e2     # the tests as they were at a commit
    python tests/mutants.py --only softmax W_O       # some mutants
    python tests/mutants.py --all                    # no -x: every failing test (~2 min a mutant)
    python tests/mutants.py --killers                # only the named killers, in one interpreter

It prints a Markdown table: mutant, the first test that failed (``pytest -x``) or, with
``--all``, every failing test, and how long that took. tests/test_mutants.py runs
``--killers`` in CI: each mutant's killers must fail on it, and pass on the unmutated library.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    word: str  # the key of mha.exercises.MISTAKES this mutant is an instance of
    what: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new); old occurs exactly once in file
    killers: tuple[str, ...]  # tests of the current suite that fail on it


_SCALE = "    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale\n"

MUTANTS = [
    Mutant(
        "split-transpose", "transpose", "split_heads reshapes (B, T, D) straight to (B, h, T, d_k)",
        (("mha/heads.py", "return x.view(B, T, h, x.size(-1) // h).transpose(1, 2)",
          "return x.reshape(B, h, T, x.size(-1) // h)"),),
                (
            "tests/test_cases.py::test_C6_heads_are_merged_in_the_right_order",
            "tests/test_exercises.py::test_right_code_passes[check_split_heads-split_heads]",
        ),
    ),
    Mutant(
        "merge-transpose", "transpose", "merge_heads reshapes (B, h, T, d_k) straight to (B, T, D)",
        (("mha/heads.py", "return x.transpose(1, 2).reshape(B, T, h * d_k)", "return x.reshape(B, T, h * d_k)"),),
                (
            "tests/test_cases.py::test_C6_heads_are_merged_in_the_right_order",
            "tests/test_exercises.py::test_right_code_passes[check_merge_heads-merge_heads]",
        ),
    ),
    Mutant(
        "scale-none", "scale", "no scaling by default",
        (("mha/attention.py", _SCALE, "    scale = 1.0 if scale is None else scale\n"),),
                (
            "tests/test_contract.py::test_default_scale_is_inverse_sqrt_dk",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "scale-d_k", "scale", "default scale 1/d_k",
        (("mha/attention.py", _SCALE, "    scale = 1.0 / q.size(-1) if scale is None else scale\n"),),
                (
            "tests/test_contract.py::test_default_scale_is_inverse_sqrt_dk",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "scale-d_model", "scale", "the layer scales by 1/sqrt(d_model)",
        (("mha/multihead.py", "enable_gqa=self.n_kv_heads != self.h)",
          "enable_gqa=self.n_kv_heads != self.h, scale=self.d_model ** -0.5)"),),
                (
            "tests/test_interop.py::test_from_torch_copies_exactly",
            "tests/test_exercises.py::test_right_code_passes[check_multi_head_attention-MultiHeadAttention]",
        ),
    ),
    Mutant(
        "softmax", "softmax", "softmax over the queries (dim -2) on the explicit path",
        (("mha/attention.py", "torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),),
                (
            "tests/test_contract.py::test_rows_sum_to_one_without_dropout",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "inverted-mask", "inverted", "the keep-mask is read as True = blocked",
        (("mha/attention.py", "keep = as_keep_mask(mask, device=q.device)",
          "keep = ~as_keep_mask(mask, device=q.device)"),),
                (
            "tests/test_cases.py::test_C3_bool_mask_agrees_with_pytorch_sdpa",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "inverted-torch-mask", "inverted", "to_torch_attn_mask passes the keep-mask through",
        (("mha/masks.py", "        return ~keep\n", "        return keep\n"),
         ("mha/masks.py", "return ~keep.expand(B, h, T, S)", "return keep.expand(B, h, T, S)")),
                (
            "tests/test_interop.py::test_to_torch_attn_mask_inverts_keep_masks_and_repeats_them_per_head",
            "tests/test_exercises.py::test_right_code_passes[check_torch_attn_mask-to_torch_attn_mask]",
        ),
    ),
    Mutant(
        "value", "value", "K where V belongs, on both paths",
        (("mha/attention.py", "return weights @ v, weights", "return weights @ k, weights"),
         ("mha/attention.py", "q, k, v, attn_mask=keep,", "q, k, k, attn_mask=keep,")),
                (
            "tests/test_cases.py::test_C3_bool_mask_agrees_with_pytorch_sdpa",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "slice", "slice", "each head's projections read only its slice of x",
        (("mha/multihead.py", "        q, k, v = self.qkv(x).unflatten(",
          "        head = torch.arange(self.d_model, device=x.device) // self.d_k\n"
          "        rows = torch.cat([head, head[: self._widths[1]], head[: self._widths[1]]])\n"
          "        blind = rows[:, None] == head[None, :]\n"
          "        q, k, v = torch.nn.functional.linear(x, self.qkv.weight * blind, self.qkv.bias).unflatten("),),
                (
            "tests/test_interop.py::test_from_torch_copies_exactly",
            "tests/test_exercises.py::test_right_code_passes[check_multi_head_attention-MultiHeadAttention]",
        ),
    ),
    Mutant(
        "W_O", "W_O", "the layer returns the concatenated heads without W_O",
        (("mha/multihead.py", "y = self.out(out.transpose(1, 2).flatten(2))", "y = out.transpose(1, 2).flatten(2)"),),
                (
            "tests/test_interop.py::test_from_torch_copies_exactly",
            "tests/test_exercises.py::test_right_code_passes[check_multi_head_attention-MultiHeadAttention]",
        ),
    ),
    Mutant(
        "concat", "concat", "merge_heads sums the heads (copied h times so the shapes still fit)",
        (("mha/heads.py", "return x.transpose(1, 2).reshape(B, T, h * d_k)",
          "return x.sum(1, keepdim=True).expand(B, h, T, d_k).transpose(1, 2).reshape(B, T, h * d_k)"),),
                (
            "tests/test_cases.py::test_C6_heads_are_merged_in_the_right_order",
            "tests/test_exercises.py::test_right_code_passes[check_merge_heads-merge_heads]",
        ),
    ),
    Mutant(
        "float-mask-explicit", "float mask", "the explicit path adds the keep-mask's 0s and 1s to the scores",
        (("mha/attention.py", 'scores += scores.new_zeros(keep.shape).masked_fill_(~keep, float("-inf"))',
          "scores += keep.to(scores.dtype)"),),
                (
            "tests/test_cases.py::test_C2_float_01_mask_blocks_and_additive_mask_raises",
            "tests/test_exercises.py::test_right_code_passes[check_attention-library_attention]",
        ),
    ),
    Mutant(
        "float-mask-fused", "float mask", "the fused path hands PyTorch the keep-mask as 0s and 1s, which it adds",
        (("mha/attention.py", "q, k, v, attn_mask=keep,",
          "q, k, v, attn_mask=None if keep is None else keep.to(q.dtype),"),),
                (
            "tests/test_cases.py::test_C2_float_01_mask_blocks_and_additive_mask_raises",
            "tests/test_cases.py::test_C3_bool_mask_agrees_with_pytorch_sdpa",
        ),
    ),
    Mutant(
        "causal-layer", "causal", "MultiHeadAttention ignores causal=True",
        (("mha/multihead.py", "is_causal=causal,", "is_causal=False,"),),
                (
            "tests/test_cases.py::test_C6_heads_are_merged_in_the_right_order",
            "tests/test_exercises.py::test_right_code_passes[check_multi_head_attention-MultiHeadAttention]",
        ),
    ),
    Mutant(
        "causal-function", "causal", "scaled_dot_product_attention ignores is_causal=True",
        (("mha/attention.py", _SCALE, _SCALE + "    is_causal = False\n"),),
                (
            "tests/test_contract.py::test_causal_combines_with_mask",
            "tests/test_exercises.py::test_right_code_passes[check_multi_head_attention-MultiHeadAttention]",
        ),
    ),
]


def mutate(root: Path, mutant: Mutant) -> None:
    """Apply ``mutant``'s edits to the library under ``root`` (a copy, never the checkout)."""
    for file, old, new in mutant.edits:
        path = root / file
        text = path.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"mutant {mutant.name}: {old!r} occurs {text.count(old)} times in {file}")
        path.write_text(text.replace(old, new))


def copy_project(dest: Path, tests_from: str | None = None, only: tuple[str, ...] = ()) -> None:
    """Copy the working tree's files (tracked and untracked, not ignored) to ``dest``.

    With ``tests_from``, tests/ is replaced by tests/ as it was at that git revision;
    ``only`` limits the copy to these paths.
    """
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *only],
        cwd=ROOT, capture_output=True, check=True, text=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    if tests_from:
        shutil.rmtree(dest / "tests")
        archive = subprocess.run(["git", "archive", tests_from, "tests"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def run_pytest(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root, env=env, capture_output=True, text=True,
    )


def failures(result: subprocess.CompletedProcess) -> list[str]:
    """The ids of the failed tests, from pytest's -rfE summary."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)


def check_killers(mutants: list[Mutant]) -> int:
    """In this one interpreter: every killer passes on the library, and fails on its mutant.

    Each run imports a fresh copy of mha and of the tests (pytest in-process), so torch is
    imported once rather than once per mutant. Returns 0 when all is as expected.
    """
    import pytest

    class Failures:  # a pytest plugin: the ids of the tests that failed
        def __init__(self):
            self.ids = []

        def pytest_runtest_logreport(self, report):
            if report.failed:
                self.ids.append(report.nodeid)

    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("unmutated", None, sorted({k for m in mutants for k in m.killers}))]
        runs += [(m.name, m, list(m.killers)) for m in mutants]
        for label, mutant, killers in runs:
            root = Path(tmp) / label
            copy_project(root, only=("mha", "tests", "pyproject.toml"))
            if mutant is not None:
                mutate(root, mutant)
            for name, module in list(sys.modules.items()):  # forget the previous copy's mha and tests
                from_copy = (getattr(module, "__file__", None) or "").startswith(tmp)
                if name == "mha" or name.startswith("mha.") or from_copy:
                    del sys.modules[name]
            sys.path.insert(0, str(root))
            failures = Failures()
            try:
                args = ["-q", "--tb=no", "-p", "no:cacheprovider", "--rootdir", str(root)]
                code = pytest.main([*args, *(str(root / k) for k in killers)], plugins=[failures])
            finally:
                sys.path.remove(str(root))
            if mutant is None:
                ok = code == pytest.ExitCode.OK
            else:  # every killer, not just one of them, must fail
                ok = code == pytest.ExitCode.TESTS_FAILED and all(
                    any(f == k or f.startswith(k + "[") for f in failures.ids) for k in killers
                )
            print(f"{label}: {'as expected' if ok else 'NOT as expected'} (pytest exit code {int(code)}, "
                  f"failed: {failures.ids})", flush=True)
            if not ok:
                problems.append(label)
    print("every mutant fails all its killers, which pass on the library" if not problems else f"wrong: {problems}")
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests-from", metavar="REV", help="run the tests as they were at this git revision")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--all", action="store_true", help="run the whole suite (no -x) and list every failure")
    parser.add_argument("--killers", action="store_true",
                        help="only run each mutant's named killers, in one interpreter (what CI does)")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.killers:
        return check_killers(mutants)
    print(f"tests: {args.tests_from or 'working tree'}\n")
    column = "failing tests, by file" if args.all else "first failing test"
    print(f"| mutant | mistake | what it does | {column} | seconds |")
    print("|---|---|---|---|---|")
    survivors = 0
    for mutant in mutants:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            copy_project(root, args.tests_from)
            mutate(root, mutant)
            start = time.perf_counter()
            result = run_pytest(root, ["-rfE", "--tb=no", "tests"] if args.all else ["-x", "-rfE", "tests"])
            seconds = time.perf_counter() - start
        failed = failures(result)
        survivors += not failed
        if not failed:
            verdict = "**survived**"
        elif args.all:
            by_file = Counter(name.split("::")[0].removeprefix("tests/") for name in failed)
            verdict = f"{len(failed)}: " + ", ".join(f"{file} {n}" for file, n in sorted(by_file.items()))
        else:
            verdict = f"`{failed[0]}`"
        print(f"| {mutant.name} | {mutant.word} | {mutant.what} | {verdict} | {seconds:.0f} |", flush=True)
        if args.all and failed:
            print("\n".join(f"<!-- {mutant.name}: {name} -->" for name in failed), flush=True)
    print(f"\n{len(mutants) - survivors} of {len(mutants)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
