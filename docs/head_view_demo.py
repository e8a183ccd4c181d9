"""The head view shown on the website's head view page (docs/head_view.md), and checked by tests/test_site.py.

Two layers of causal self-attention with a residual connection, as in the course's tiny transformer, on
random embeddings of the article's sentence: the layers are untrained, so the heads show no grammar yet.
The notebooks use the view on trained heads.
"""

import torch

import mha
from mha.plot import head_view

TOKENS = "the animal didn't cross the street because it was too tired".split()
D_MODEL, H = 32, 4


def weights() -> list[torch.Tensor]:
    """One (h, T, T) table of attention weights per layer."""
    torch.manual_seed(0)
    layers = [mha.MultiHeadAttention(D_MODEL, H) for _ in range(2)]
    x = torch.randn(1, len(TOKENS), D_MODEL)  # (B, T, d_model): random stand-ins for embeddings
    tables = []
    with torch.no_grad():
        for layer in layers:
            y, w = layer(x)  # (1, T, d_model), (1, h, T, T); causal by default
            x = x + y
            tables.append(w[0])
    return tables


def view():
    return head_view(weights(), TOKENS, layer_names=["layer 1", "layer 2"])
