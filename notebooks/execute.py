"""Re-execute notebooks top to bottom, in place, and keep their metadata clean.

    python notebooks/execute.py                      # every notebook
    python notebooks/execute.py notebooks/02_*.ipynb # some of them
    python notebooks/execute.py --refresh-timing ... # also store new timings (see below)

This is `jupyter execute --inplace` (the same nbclient engine) without what would make
a re-run change the file when nothing really changed:

* no per-cell timestamps;
* stream output is stored as a front-end shows it: chunks joined, carriage returns and
  backspaces applied (a tqdm progress bar is stored as its final line, not as every
  redraw the kernel happened to flush);
* a cell marked ``# NBVAL_IGNORE_OUTPUT`` (timing cells) whose code is as committed in git
  keeps its stored output when the new one differs only in its numbers. Pass
  ``--refresh-timing`` to store the new numbers anyway, e.g. after a change that makes
  something faster.

The kernel is ipykernel in the interpreter that runs this script (``sys.executable``), whatever
"python3" kernelspec Jupyter would find first: one that ``ipykernel install --user`` left from
another environment, say, which a conda or system Python finds before its own (case C26).
``--nbval-current-env``, which checks the outputs, uses this interpreter too.

When a cell raises, the notebook is left as it was, and the script says which notebook and
which cell (its index among all cells, from 0, and its first line), the error, then the cell's
own traceback without colour codes, and exits with status 1. A kernel that does not start or
that dies, a cell that runs past the timeout and a file that is not a notebook get one line
each, naming the notebook (and the cell, or the interpreter and its last words), and status 1;
a notebook that does not exist is a usage error: one line, status 2.
"""

import argparse
import atexit
import copy
import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
IGNORE_MARK = "NBVAL_IGNORE_OUTPUT"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes in IPython's tracebacks


KERNEL = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
QUIET = logging.getLogger("execute.py")  # nbclient and jupyter_client log a failed start: the one line says it
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


class ThisInterpreter(KernelSpecManager):
    """Kernelspecs with one kernel for every name: ipykernel in this interpreter (``KERNEL``)."""

    def get_kernel_spec(self, kernel_name):
        return KernelSpec(argv=KERNEL, display_name="Python 3", language="python")


class CellFailed(Exception):
    """The notebook could not be executed: the message (one line) names the notebook, and the cell when one was
    running, and what happened; ``traceback`` is the cell's own, when it raised."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


def execute(path: Path, refresh_timing: bool = False, timeout: int = 600) -> None:
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # invalid JSON (NotJSONError), not a notebook, unreadable: what nbformat says
        raise CellFailed(f"{path}: not a notebook nbformat can read ({first_line(err)[:200]})") from None
    stored = [copy.deepcopy(cell.get("outputs")) for cell in nb.cells]
    committed = committed_sources(path)
    running = []  # the index of each cell as it starts: the last one is the cell that failed, if one does
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter(), log=QUIET)
    client = NotebookClient(
        nb, km=km, timeout=timeout, record_timing=False, log=QUIET,
        resources={"metadata": {"path": str(path.parent)}},
        # ipykernel 7 logs a warning about TCP without encryption at every start; errors still show.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        on_cell_execute=lambda cell, cell_index: running.append(cell_index),
    )
    with tempfile.TemporaryFile("w+") as kernel_stderr:  # what the kernel process itself prints, outside any cell
        try:
            client.execute(stderr=kernel_stderr, cleanup_kc=True)  # (shut the kernel down after, as with its own km)
        except CellExecutionError as err:
            raise failed_cell(path, nb, err, running[-1] if running else None) from None
        except DeadKernelError:
            died = "the kernel died (os._exit, a crash, or out of memory)"
            raise CellFailed(f"{path}: {where(nb, running)}: {died}") from None
        except CellTimeoutError:
            raise CellFailed(f"{path}: {where(nb, running)} ran past the timeout of {timeout} s") from None
        except (OSError, RuntimeError) as err:  # the kernel did not start: jupyter_client's words, and the kernel's
            if running:
                raise
            atexit.unregister(client._cleanup_kernel)  # left registered by nbclient; at exit it would fail again
            raise CellFailed(f"{path}: the kernel did not start ({' '.join(KERNEL[:3])}): "
                             f"{first_line(err)}{last_words(kernel_stderr)}") from None
        finally:
            kernel_stderr.seek(0)
            sys.stderr.write(kernel_stderr.read())  # (empty after a start that failed: last_words read it)
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for cell, old in zip(nb.cells, stored):
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = merge_streams(cell.outputs)
        keep = IGNORE_MARK in cell.source and committed.get(cell.get("id")) == cell.source
        if keep and not refresh_timing and old and same_but_numbers(old, cell.outputs):
            cell.outputs = old
    nbformat.write(nb, path)
    print(f"executed {path.name}")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def last_words(stderr) -> str:
    """'; it said: <its last line>' from what a kernel that did not start printed, or ''; empties the file."""
    stderr.seek(0)
    lines = [line.strip() for line in stderr.read().splitlines() if line.strip()]
    stderr.seek(0)
    stderr.truncate()
    return f"; it said: {lines[-1][:300]}" if lines else ""


def failed_cell(path: Path, nb, err: CellExecutionError, index: int | None) -> CellFailed:
    """The cell that raised (the last one started: an earlier cell tagged raises-exception may have raised too,
    as it is allowed to) and what, in one line; its traceback as its error output shows it."""
    error = f"{err.ename}: {err.evalue}" if err.evalue else err.ename
    if index is None:  # no cell started: nbclient's own message, which names no cell
        return CellFailed(f"{path}: {error}")
    traceback = "\n".join(ANSI.sub("", line) for out in nb.cells[index].get("outputs", [])
                          if out.get("output_type") == "error" for line in out.get("traceback", []))
    return CellFailed(f"{path}: {where(nb, [index])} raised {error}", traceback)


def where(nb, running: list) -> str:
    """'cell i ('its first line')' for the last cell started, or 'before any cell ran'."""
    if not running:
        return "before any cell ran"
    index = running[-1]
    first = next((line.strip() for line in nb.cells[index].source.splitlines() if line.strip()), "")
    first = first if len(first) <= 80 else first[:77] + "..."
    return f"cell {index} ({first!r})"


def committed_sources(path: Path) -> dict:
    """Cell id -> source of the notebook as committed in git (empty if it is not in git)."""
    try:
        r = subprocess.run(["git", "show", f"HEAD:./{path.name}"], cwd=path.parent, capture_output=True, text=True)
    except OSError:
        return {}
    if r.returncode != 0:
        return {}
    return {cell.get("id"): cell.source for cell in nbformat.reads(r.stdout, as_version=4).cells}


def merge_streams(outputs):
    """Join consecutive stdout (or stderr) chunks and store the text as it is displayed, so
    that how the kernel happened to flush a cell's prints does not change the stored notebook."""
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" and prev.name == out.name:
            prev.text += out.text
        else:
            merged.append(out)
    for out in merged:
        if out.output_type == "stream":
            out.text = as_displayed(out.text)
    return merged


def as_displayed(text: str) -> str:
    """Stream text as a terminal or a Jupyter front-end shows it.

    A backspace erases the character before it; ``\\r\\n`` is a newline; a lone ``\\r``
    returns to the start of the line, and what follows overwrites what was there.
    """
    while (erased := re.sub("[^\n\x08]\x08", "", text)) != text:
        text = erased
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown)
    return "\n".join(lines)


def same_but_numbers(old, new) -> bool:
    """Whether two lists of outputs are equal once every run of digits is masked."""
    def masked(outputs):
        return re.sub(r"\d+", "0", json.dumps(outputs, sort_keys=True))

    return masked(old) == masked(new)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2 (argparse's for a usage error), no usage dump
        self.exit(2, f"execute.py: error: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(prog="execute.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every notebook in notebooks/)")
    parser.add_argument("--refresh-timing", action="store_true",
                        help="store new outputs in NBVAL_IGNORE_OUTPUT cells even if only their numbers changed")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(HERE.glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:  # before any notebook runs
        parser.error(f"no such notebook: {', '.join(missing)}")
    for p in paths:
        try:
            execute(p, refresh_timing=args.refresh_timing)
        except CellFailed as failed:
            print(f"execute.py: {failed} (the notebook was not changed)", file=sys.stderr)
            if failed.traceback:
                print(failed.traceback, file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"execute.py: {p}: interrupted (the notebook was not changed)", file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
