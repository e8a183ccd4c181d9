"""Re-execute notebooks top to bottom, in place, and keep their metadata clean.

    python notebooks/execute.py                      # every notebook
    python notebooks/execute.py notebooks/02_*.ipynb # some of them

This is `jupyter execute --inplace` (the same nbclient engine) without the
per-cell timestamps it records, so a re-run changes only what really changed.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    nbformat.write(nb, path)
    print(f"executed {path.name}")


def merge_streams(outputs):
    """Join consecutive stdout (or stderr) chunks, so that how the kernel happened to
    flush a cell's prints does not change the stored notebook."""
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" and prev.name == out.name:
            prev.text += out.text
        else:
            merged.append(out)
    return merged


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(HERE.glob("*.ipynb"))
    for p in paths:
        execute(p)
