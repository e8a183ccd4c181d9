"""Notebook 02 runs the article's code exactly as printed (issue 16 §1).

The article (Part 6, "Multi-head attention: many ways of looking at one sentence") prints one code block. It is held
here as a literal, copied character for character, and the notebook must contain it as one code cell, unchanged,
with the article's printed result as that cell's stored output. Only ``scaled_dot_product_attention`` ("from the
previous post") comes from ``mha``, imported in a cell of its own before its first use (the loop of small heads
that comes before the article's class uses it too), and nothing before the article's cell defines the class or
another ``scaled_dot_product_attention``.
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "02_multi_head_attention.ipynb"

ARTICLE_CODE = """\
import torch

class MultiHeadAttention(torch.nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.dk = h, d_model // h
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)   # one matrix makes Q, K and V
        self.out = torch.nn.Linear(d_model, d_model)       # W_O

    def forward(self, x, causal=True):
        B, T, D = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        split = lambda t: t.view(B, T, self.h, self.dk).transpose(1, 2)   # -> (B, h, T, dk)
        q, k, v = split(q), split(k), split(v)
        mask = torch.tril(torch.ones(T, T)) if causal else None
        o, w = scaled_dot_product_attention(q, k, v, mask)   # from the previous post
        o = o.transpose(1, 2).reshape(B, T, D)               # concatenate the heads
        return self.out(o), w

x = torch.randn(2, 6, 32)
y, w = MultiHeadAttention(d_model=32, h=4)(x)
print(y.shape, w.shape)    # torch.Size([2, 6, 32]) torch.Size([2, 4, 6, 6])"""

PRINTED = "torch.Size([2, 6, 32]) torch.Size([2, 4, 6, 6])"  # the comment on the article's last line


def code_cells():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code"]


def source(cell):
    return "".join(cell["source"])


def test_the_article_code_block_is_one_cell_of_notebook_02_unchanged():
    sources = [source(c) for c in code_cells()]
    assert sources.count(ARTICLE_CODE) == 1, "notebook 02 has no code cell that is the article's code block as printed"


def test_it_ran_and_printed_what_the_article_says():
    (cell,) = [c for c in code_cells() if source(c) == ARTICLE_CODE]
    printed = "".join("".join(o["text"]) for o in cell["outputs"] if o["output_type"] == "stream")
    assert printed == PRINTED + "\n"


def test_only_its_attention_function_comes_from_mha_in_a_cell_of_its_own():
    sources = [source(c) for c in code_cells()]
    before = sources[: sources.index(ARTICLE_CODE)]
    uses = [s for s in before if "scaled_dot_product_attention" in s]
    assert uses, "no cell before the article's code imports scaled_dot_product_attention"
    lines = [line for line in uses[0].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert [line.split("#")[0].strip() for line in lines] == ["from mha import scaled_dot_product_attention"]
    # nothing earlier defines the class or rebinds the function: the ones that run are the article's and Part 5's
    rebinds = re.compile(r"^\s*(class MultiHeadAttention\b|def scaled_dot_product_attention\b|"
                         r"scaled_dot_product_attention\s*=[^=]|import .*\bscaled_dot_product_attention\b)", re.M)
    assert not any(rebinds.search(s) for s in before if s is not uses[0]), [s[:80] for s in before if rebinds.search(s)]
