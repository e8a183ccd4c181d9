"""Notebook 05's task, model, training and measurements, as a module that induction_seeds.py can run many times.

This is the code of notebook 05's sections 1 to 7, with what the notebook keeps in global variables (the
evaluation set, the number of steps) made arguments. With the notebook's settings it trains the very same models:
the same batches, the same initial weights, the same updates (one thread). tests/test_induction_seeds.py checks
that the functions here are the notebook's, line for line.

The task: 20 letters, all different, whose last L letters (L from 4 to 10) repeat the L before them; the loss
counts the predictions inside the repeat. The model: token + position embeddings, two layers of causal
``mha.MultiHeadAttention(32, h)`` with residual connections, an unembedding; no MLP, no layer norm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import mha

V, T = 26, 20  # vocabulary: the letters A..Z; sequence length
L_MIN, L_MAX = 4, 10  # length of the repeated stretch
STEPS = 500
EVAL_SEED = 1  # the evaluation set's generator


def make_batch(n, generator):
    """n sequences whose last L letters (L drawn per sequence) repeat the L before them: tokens, in_repeat (n, T)."""
    fresh = torch.rand(n, V, generator=generator).argsort(dim=-1)[:, :T]  # (n, T): all different within a row
    L = torch.randint(L_MIN, L_MAX + 1, (n, 1), generator=generator)  # (n, 1)
    pos = torch.arange(T)  # (T,)
    in_repeat = pos >= T - L  # (n, T)
    source = torch.where(in_repeat, pos - L, pos)  # (n, T): inside the repeat, copy from L positions back
    return fresh.gather(1, source), in_repeat


class Block(nn.Module):
    """x + attention(x): one layer of causal self-attention with a residual connection."""

    def __init__(self, d_model, h):
        super().__init__()
        self.attn = mha.MultiHeadAttention(d_model, h)

    def forward(self, x):
        y, w = self.attn(x)  # (B, T, d_model), (B, h, T, T); causal by default
        return x + y, w


class TinyTransformer(nn.Module):
    """Embeddings, n_layers attention blocks, unembedding. Returns the logits and all heads' weights."""

    def __init__(self, vocab_size, context, d_model=32, h=4, n_layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)  # one learned vector per position 0..context-1
        self.blocks = nn.ModuleList(Block(d_model, h) for _ in range(n_layers))
        self.unembed = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)  # (B, T) -> (B, T, d_model)
        weights = []
        for block in self.blocks:
            x, w = block(x)  # (B, T, d_model), (B, h, T, T)
            weights.append(w)
        return self.unembed(x), torch.stack(weights, dim=1)  # (B, T, vocab_size), (B, n_layers, h, T, T)


def head_scores(weights, in_repeat):
    """(B, n_layers, h, T, T) weights -> prev before the repeat, prev inside it, matched: (n_layers, h) batch means."""
    B, T = in_repeat.shape
    to_prev = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, n_layers, h, T-1): query t -> key t-1
    before = (~in_repeat[:, 1:])[:, None, None]  # (B, 1, 1, T-1): queries 1..T-1 before the repeat
    inside = in_repeat[:, 1:][:, None, None]  # (B, 1, 1, T-1)
    prev_before = (to_prev * before).sum((0, -1)) / before.sum()
    prev_inside = (to_prev * inside).sum((0, -1)) / inside.sum()
    L = in_repeat.sum(dim=1, keepdim=True)  # (B, 1)
    j = (torch.arange(T, device=weights.device) - L + 1).clamp(min=0)  # (B, T): matched key of each query
    j = j[:, None, None, :, None].expand(*weights.shape[:-1], 1)  # (B, n_layers, h, T, 1)
    to_matched = weights.gather(-1, j).squeeze(-1)  # (B, n_layers, h, T)
    rep = in_repeat[:, None, None]  # (B, 1, 1, T)
    matched = (to_matched * rep).sum((0, -1)) / rep.sum()
    return prev_before, prev_inside, matched


def repeat_loss(model, tokens, in_repeat):
    """Cross-entropy of the next-letter predictions made inside the repeat."""
    logits, _ = model(tokens)  # (B, T, V)
    inside = in_repeat[:, :-1]  # (B, T-1): query t in the repeat predicts letter t+1
    return F.cross_entropy(logits[:, :-1][inside], tokens[:, 1:][inside])


def train(model, get_batch, loss_fn, steps, lr=3e-3, quiet=False):
    """AdamW on get_batch() for `steps` steps; prints the mean loss of every 100 (unless quiet), returns every loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(1, steps + 1):
        loss = loss_fn(model, *get_batch())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 and not quiet:
            print(f"steps {step - 99:3d}-{step}: mean loss {sum(losses[-100:]) / 100:.1f}")
    return losses


def solved_at(run, window=25):
    """The first step whose window of `window` steps has a mean loss below 1 nat."""
    return next(s + window for s in range(0, len(run), window) if sum(run[s : s + window]) / window < 1.0)


def attention_with_ablation(attn, x, keep):
    """attn(x) with head i's output multiplied by keep[i] (0 = ablated) before W_O."""
    q, k, v = mha.project(attn, x)  # each (B, T, d_model)
    q, k, v = (mha.split_heads(t, attn.h) for t in (q, k, v))  # each (B, h, T, d_k)
    out, w = mha.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k), (B, h, T, T)
    out = out * keep[:, None, None]  # (B, h, T, d_k): zero the ablated heads
    return attn.out(mha.merge_heads(out))  # (B, T, h*d_k) -> (B, T, d_model)


def forward_with_ablation(model, tokens, keep):
    """The model's forward pass; keep is (n_layers, h) of 0s and 1s."""
    positions = torch.arange(tokens.size(1), device=tokens.device)
    x = model.tok(tokens) + model.pos(positions)  # (B, T, d_model)
    for block, keep_layer in zip(model.blocks, keep):
        x = x + attention_with_ablation(block.attn, x, keep_layer)
    return model.unembed(x)  # (B, T, vocab_size)


def batches(seed, device="cpu"):
    """get_batch for train: 64 fresh sequences a call, from a generator of their own seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return lambda: [t.to(device) for t in make_batch(64, generator)]


class Evaluation:
    """The notebook's fixed evaluation set (1,000 sequences) and its two guessing levels."""

    def __init__(self, device="cpu"):
        x_eval, rep_eval = make_batch(1000, torch.Generator().manual_seed(EVAL_SEED))
        self.x, self.rep = x_eval.to(device), rep_eval.to(device)
        self.inside = self.rep[:, :-1]  # (B, T-1): queries whose next letter is scored
        seen = F.one_hot(self.x, V).cummax(dim=1).values.sum(-1)  # (B, T): distinct letters among tokens 0..t
        self.guess_all = math.log(V)
        self.guess_seen = seen[:, :-1][self.inside].double().log().mean().item()

    def loss(self, model, keep=None):
        """The evaluation loss inside the repeat; with keep (n_layers, h), with heads switched off."""
        with torch.no_grad():
            if keep is None:
                return repeat_loss(model, self.x, self.rep).item()
            logits = forward_with_ablation(model, self.x, keep.to(self.x.device))
        return F.cross_entropy(logits[:, :-1][self.inside], self.x[:, 1:][self.inside]).item()

    def accuracy(self, model):
        with torch.no_grad():
            logits, _ = model(self.x)
        return (logits[:, :-1].argmax(-1) == self.x[:, 1:])[self.inside].float().mean().item()


def ablation(model, evaluation, loss):
    """The loss increase when one head is switched off, (n_layers, h), and when a whole layer is, [n_layers]."""
    n_layers, h = len(model.blocks), model.blocks[0].attn.h
    keep_all = torch.ones(n_layers, h)
    one_off = torch.zeros(n_layers, h)
    for layer in range(n_layers):
        for head in range(h):
            keep = keep_all.clone()
            keep[layer, head] = 0.0
            one_off[layer, head] = evaluation.loss(model, keep) - loss
    layer_off = []
    for layer in range(n_layers):
        keep = keep_all.clone()
        keep[layer] = 0.0
        layer_off.append(evaluation.loss(model, keep) - loss)
    return one_off, layer_off


def measure(trained, run_losses, evaluation):
    """What notebook 05's sections 4 to 6 measure and section 7 counts, on one trained model (ablation for h > 1
    and two layers only)."""
    with torch.no_grad():
        _, w_s = trained(evaluation.x)
    loss_s = evaluation.loss(trained)
    r = dict(loss=loss_s, accuracy=evaluation.accuracy(trained), plateau=min(run_losses[:100]),
             solved=solved_at(run_losses) if min(run_losses) < 1 else None)
    if len(trained.blocks) < 2:
        return r
    prev_b, prev_i, match = head_scores(w_s, evaluation.rep)
    p, j = int(prev_b[0].argmax()), int(match[1].argmax())  # the best previous-token and induction heads
    r.update(prev=prev_b[0, p].item(), inside=(prev_i[0, p] / prev_b[0, p]).item(), induction=match[1, j].item(),
             n_induction=int((match[1] > 0.5).sum()), prev_head=p)
    if trained.blocks[0].attn.h > 1:
        one_off, layer_off = ablation(trained, evaluation, loss_s)
        r.update(layer_1=layer_off[0], layer_2=layer_off[1], prev_cost=one_off[0, p].item(),
                 costliest=int(one_off.flatten().argmax()) == p, max_l2=one_off[1].max().item())
    return r


def run(seed, h=4, n_layers=2, steps=STEPS, evaluation=None, device="cpu"):
    """Train one model as notebook 05 does (initial weights and batches from `seed`); return what measure() finds
    and the mean training loss of every 10 steps (notebook 05 draws it), the model, and every step's loss."""
    evaluation = evaluation or Evaluation(device)
    torch.manual_seed(seed)
    model = TinyTransformer(V, T, h=h, n_layers=n_layers).to(device)
    losses = train(model, batches(seed, device), repeat_loss, steps, quiet=True)
    curve = [float(f"{sum(losses[s : s + 10]) / 10:.4g}") for s in range(0, steps, 10)]  # steps 1-10, 11-20, ...
    return (dict(seed=seed, h=h, n_layers=n_layers, steps=steps, **measure(model, losses, evaluation), curve=curve),
            model, losses)
