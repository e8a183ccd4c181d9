"""Inputs and usage found by trying to break mha before 0.4.0, one test per finding.

Each test states the promise it holds mha to and, where PyTorch has one, what PyTorch's reference does.
"""

import copy
import math
import pathlib
import pickle
import re
import traceback

import numpy as np
import pytest
import torch
from helpers import assert_close
from torch import nn

import mha

MHA_DIR = pathlib.Path(mha.__file__).parent


def raises_clearly(call, match):
    """Run ``call``; it must raise ValueError or TypeError from mha's own code (not from inside torch or numpy),
    with a message matching ``match``. Returns the message."""
    with pytest.raises(Exception) as info:
        call()
    err = info.value
    last = pathlib.Path(traceback.extract_tb(err.__traceback__)[-1].filename)
    assert isinstance(err, (ValueError, TypeError)) and MHA_DIR in last.parents, (
        f"{type(err).__name__} raised at {last}: {str(err)[:200]}")
    assert re.search(match, str(err)), str(err)
    return str(err)


# -- 1. KVCache: copy.deepcopy of a model together with its caches ------------------------------------------------


class _Decoder(nn.Module):
    """Hand-written generation code's shape: one KVCache per layer, kept on the model."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([mha.MultiHeadAttention(16, 4, dtype=torch.float64) for _ in range(2)])
        self.caches = [mha.KVCache() for _ in self.layers]

    def forward(self, x):
        for layer, cache in zip(self.layers, self.caches):
            x = x + layer(x, cache=cache)[0]
        return x


def test_deepcopy_of_a_model_with_its_caches_keeps_decoding():
    # Forking a whole decoding state (beam search, speculative decoding) with copy.deepcopy: the copied caches
    # must belong to the copied layers. KVCache.__deepcopy__ ignores the memo, so each copied cache still names
    # the original layer as its owner and the copied model's next step raises "holds the keys of another layer".
    # pickle (and torch.save/load) of the same object keeps the owners right.
    dec = _Decoder().eval()
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    dec(x[:, :3])
    expected = pickle.loads(pickle.dumps(dec))(x[:, 3:])  # the same fork, by pickle
    forked = copy.deepcopy(dec)
    assert_close(forked(x[:, 3:]), expected)
    # and the fork is independent: the original steps on as if nothing had been copied
    assert_close(dec(x[:, 3:]), expected)
    assert [len(c) for c in forked.caches] == [len(c) for c in dec.caches] == [4, 4]


def test_deepcopy_of_a_layer_and_its_cache_together():
    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64).eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    cache = mha.KVCache(max_len=8)
    m(x[:, :4], cache=cache)
    m2, cache2 = copy.deepcopy((m, cache))
    assert_close(m2(x[:, 4:], cache=cache2)[0], m(x)[0][:, 4:])


# -- 1b. NaN in padded rows of x: what each of the docstrings' two recipes keeps finite ------------------------------


@pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])
@pytest.mark.parametrize("n_kv_heads", [4, 2], ids=["mha", "gqa"])
def test_the_padding_recipes_keep_finite_what_the_docstrings_say(n_kv_heads, need_weights):
    # padding_mask's docstring said "For NaN-free gradients mask the padded queries too", but that keeps only x's
    # gradient finite: qkv runs on the NaN rows, and its weight's gradient x.T @ grad is 0 * NaN there (as for
    # nn.MultiheadAttention's in_proj_weight). The docstrings now say so, and that replacing the rows makes every
    # gradient finite. The reference: the same loss on each sequence alone, unpadded.
    m = mha.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, dtype=torch.float64)
    lengths = [5, 3]
    pad = mha.padding_mask(lengths)
    clean = torch.randn(2, 5, 16, dtype=torch.float64)
    x = clean.masked_fill(~pad[..., None], float("nan")).requires_grad_()
    keep = pad[:, None, :, None] & pad[:, None, None, :]

    def loss(y):  # on the real tokens only
        return y.masked_fill(~pad[..., None], 0.0).pow(2).sum()

    loss(m(x, mask=keep, causal=False, need_weights=need_weights)[0]).backward()
    assert x.grad.isfinite().all() and not m.qkv.weight.grad.isfinite().all()  # what the docstrings now say
    m.zero_grad()
    loss(m(x.masked_fill(~pad[..., None], 0.0), mask=keep, causal=False, need_weights=need_weights)[0]).backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    for b, n in enumerate(lengths):
        m(clean[b : b + 1, :n], causal=False, need_weights=need_weights)[0].pow(2).sum().backward()
    for p, g in zip(m.parameters(), got):
        assert_close(g, p.grad)


# -- 1c. case C25's kind under gradient checkpointing ---------------------------------------------------------------


def test_a_gradient_penalty_through_a_checkpointed_fused_layer_equals_the_explicit_path():
    # C25's must: "the fused path gives the explicit path's numbers under every kind of differentiation that the
    # explicit path supports, or refuses in one clear message that names need_weights=True". Through
    # torch.utils.checkpoint(use_reentrant=False) the explicit path's gradient penalty equals the uncheckpointed one
    # (0.0), but the fused path raised torch's "CheckpointError: Unpack is being triggered for a tensor that was
    # already unpacked once" at mha/attention.py (_differentiable_backward reads node._saved_query after the fused
    # backward has unpacked it), already at the create_graph=True first derivative.
    from torch.utils.checkpoint import checkpoint

    m = mha.MultiHeadAttention(16, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)

    def penalty_grad(need_weights, ckpt):
        f = lambda t: m(t, need_weights=need_weights)[0]  # noqa: E731
        y = checkpoint(f, x, use_reentrant=False) if ckpt else f(x)
        g, = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), x)[0]

    expected = penalty_grad(True, ckpt=False)
    assert_close(penalty_grad(True, ckpt=True), expected)
    try:
        got = penalty_grad(False, ckpt=True)
    except (ValueError, TypeError, RuntimeError) as err:
        assert "need_weights=True" in str(err), f"{type(err).__name__}: {err}"
    else:
        assert_close(got, expected)


# -- 2. check_head rejects the right head given as tensors (case C15's kind) -------------------------------------


def test_check_head_accepts_the_right_head_given_as_tensors():
    # Notebook 06's exercise 2 says "use the numbers: compare .raw with .base and pick the head". The idiomatic
    # torch answer, torch.unravel_index(margin.argmax(), margin.shape), is a pair of 0-dim tensors, and check_head
    # called the right head "❌ wrong: ... should be a pair (layer, head) of two ints". check_answer accepts a
    # one-element tensor as its number (C15): the checker judges the value, not the type it came in.
    from mha import english
    from mha.english import measure
    from mha.exercises import check_head

    shipped = english.shipped_scores()["seeds"]["2"]["choose"]
    scores = {name: measure.Score.from_dict(d) for name, d in shipped.items()}
    score = scores["object -> its verb"]
    margin = score.raw - score.base
    right = divmod(int(margin.argmax()), margin.size(1))  # the solution notebook's answer
    for answer in (torch.unravel_index(margin.argmax(), margin.shape), tuple(np.int64(a) for a in right)):
        result = check_head(answer, scores, "object -> its verb")
        assert result.passed, result.message
    assert not check_head((torch.tensor(1.0), torch.tensor(2.0)), scores, "object -> its verb").passed  # floats
    assert not check_head((torch.tensor(True), 0), scores, "object -> its verb").passed  # a bool is no index


# -- 3. inputs of unusual layouts or devices: raw errors from inside torch ----------------------------------------


def test_a_nested_tensor_x_is_refused_by_mha_itself():
    # PyTorch's variable-length batch (its NJT + SDPA transformer tutorial feeds attention a jagged nested tensor).
    # mha raised "ValueError: NestedTensor split_with_sizes_default(self: jt, ...): expected self to be a
    # contiguous jagged layout NestedTensor" from torch/nested/_internal/ops.py. nn.MultiheadAttention refuses it
    # outside its fast path too, with an AssertionError that says so. mha should say: pad, and pass a padding mask.
    m = mha.MultiHeadAttention(8, 2)
    x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
    raises_clearly(lambda: m(x), r"(?i)nested.*pad")
    raises_clearly(lambda: m(torch.randn(2, 5, 8), x), r"(?i)nested.*pad")


def test_a_mask_on_the_meta_device_is_refused_clearly():
    # A mask "is moved to q's device", which cannot work from meta: mha raised torch's "NotImplementedError:
    # Cannot copy out of meta tensor; no data!" (mha/masks.py). F.scaled_dot_product_attention silently reads
    # uninitialised memory there (outputs of 1e22). The promise: a ValueError naming the devices.
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    raises_clearly(lambda: m(x, mask=torch.ones(5, 5, dtype=torch.bool, device="meta")), r"meta")
    q = torch.randn(1, 2, 5, 4)
    raises_clearly(lambda: mha.scaled_dot_product_attention(q, q, q, torch.ones(5, 5, dtype=torch.bool, device="meta")),
                   r"meta")


def test_an_integer_mask_on_a_meta_layer_gives_the_shapes_a_bool_mask_gives():
    # Sizing a layer on the meta device (notebook 07 does) with a Hugging Face attention_mask, which is int64 0/1:
    # a bool mask gives the shapes, the int64 one raised "RuntimeError: Tensor.item() cannot be called on meta
    # tensors" from inside torch (the 0/1 check reads values a meta tensor does not have; the checkpoint check
    # already skips meta values, mha/parameters.py).
    m = mha.MultiHeadAttention(16, 4, device="meta")
    x = torch.empty(2, 5, 16, device="meta")
    pad = torch.ones(2, 5, dtype=torch.long, device="meta")[:, None, None, :]
    for keep in (pad.bool(), pad, pad.float()):
        y, w = m(x, mask=keep)
        assert y.shape == (2, 5, 16) and w.shape == (2, 4, 5, 5)


def test_a_sparse_mask_is_used_or_refused_clearly():
    # torch.ones(5, 5).to_sparse(): mha raised "NotImplementedError: Could not run 'aten::eq.Scalar' with arguments
    # from the 'SparseCPU' backend" (a float one) or "... 'aten::any.dim' ..." (a bool one) from inside torch.
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    dense = torch.ones(5, 5).tril()
    for sparse in (dense.to_sparse(), dense.bool().to_sparse()):
        try:
            y, _ = m(x, mask=sparse)
        except (ValueError, TypeError) as err:
            raises_clearly(lambda s=sparse: m(x, mask=s), r"(?i)sparse")
            assert "dense" in str(err).lower() or "to_dense" in str(err)
        else:
            assert_close(y, m(x, mask=dense.bool())[0])


def test_vmap_over_float_01_masks_is_refused_clearly():
    # Per-sample masks by torch.func.vmap: a bool mask works, a float 0/1 one raised vmap's "RuntimeError: vmap: It
    # looks like you're attempting to use a Tensor in some data-dependent control flow" from mha/masks.py, where
    # the 0/1 check reads the values. docs/compatibility.md says to pass a bool mask under compile; under vmap
    # nothing says it, and the error does not name the mask.
    m = mha.MultiHeadAttention(16, 4)
    x = torch.randn(1, 5, 16)
    masks = (torch.rand(3, 5, 5) < 0.5) | torch.eye(5, dtype=torch.bool)
    ys = torch.func.vmap(lambda k: m(x, mask=k)[0])(masks)  # bool: works
    try:
        yf = torch.func.vmap(lambda k: m(x, mask=k)[0])(masks.float())
    except (ValueError, TypeError) as err:
        assert "bool" in str(err) and "mask" in str(err), str(err)
    else:
        assert_close(yf, ys)


# -- 4. messages that mislead ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["causal", "need_weights"])
def test_a_numpy_bool_flag_is_named_as_numpy(flag):
    # np.bool_(True) is refused, as F.scaled_dot_product_attention refuses it ("argument 'is_causal' must be bool,
    # not numpy.bool"), but mha's message read "causal must be True or False, got bool": NumPy 2 names its type
    # "bool", so the message says a bool is not a bool.
    m = mha.MultiHeadAttention(8, 2)
    message = raises_clearly(lambda: m(torch.randn(2, 3, 8), **{flag: np.bool_(True)}), flag)
    assert "numpy" in message, message


def test_plot_heads_takes_numpy_and_tensor_scalars():
    # vmax=np.float32(1.0) and vmax=w.max() were refused with "vmax must be a positive finite number or None, got
    # np.float32(1.0)" (it is one; matplotlib's imshow takes it), ncols=np.int64(2) with "ncols must be a positive
    # int"; batch_index=0.0 got numpy's raw IndexError.
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = torch.softmax(torch.randn(2, 4, 3, 3), -1)
    for kwargs in (dict(vmax=np.float32(1.0)), dict(vmax=w.max()), dict(ncols=np.int64(2))):
        plt.close(mha.plot.plot_heads(w, **kwargs))
    raises_clearly(lambda: mha.plot.plot_heads(w, batch_index=0.0), r"batch_index")


# -- 5. exercise checkers ---------------------------------------------------------------------------------------------


def test_english_load_refuses_a_seed_that_is_not_an_int_clearly():
    # load(1.0) and load(True) passed `seed in SEEDS` (1.0 == 1, True == 1) and raised FileNotFoundError for
    # mha/data/english/weights_seed1.0.pt and weights_seedTrue.pt; load("1") gets the clear ValueError.
    from mha import english

    for seed in (1.0, True):
        raises_clearly(lambda s=seed: english.load(s), r"seed")


def test_check_answer_never_raises_on_a_huge_int():
    # "the learner's answer never makes it raise": 2**1024 against a float raised OverflowError (int too large to
    # convert to float) in the comparison, before the message code that already catches it.
    from mha.exercises import check_answer

    result = check_answer(2**1024, 0.95, name="the average largest weight", tol=0.05)
    assert not result.passed and "too high" in result.message


def test_check_attention_names_an_attention_that_changes_q_in_place():
    # q.mul_(scale) in the learner's attention passed: the checker hands it clones, so it never sees that the
    # caller's q is changed (every later cell that uses q is then silently scaled, and under autograd an in-place
    # change of a saved tensor breaks backward). check_torch_attn_mask already names "mask changed in place".
    from mha.exercises import check_attention

    def attention(q, k, v, mask=None):
        q.mul_(1 / math.sqrt(q.size(-1)))
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = scores.softmax(-1)
        return w @ v, w

    result = check_attention(attention)
    assert not result.passed and "place" in result.message, result.message
