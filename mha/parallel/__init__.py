"""Heads across devices: tensor-parallel multi-head attention on ``torch.distributed``.

The heads of a layer are independent until W_O mixes them, and W_O's product
splits into one term per head:

    y = Concat(head_1, ..., head_h) W_O = sum_i head_i W_O_i

where W_O_i is head i's d_k-wide slice of W_O's input side. So N processes
("ranks") can each hold h/N heads -- those heads' rows of W_Q, W_K and W_V and
the matching columns of W_O (``nn.Linear`` stores W_O as (out, in)) -- compute
their own partial y, and one all-reduce (a sum over the ranks) gives every
rank the full y. This is Megatron-LM's tensor-parallel attention (Shoeybi et
al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism", §3 and Figure 3b).

Megatron names the two communication points f and g. g sums the partial
outputs in the forward pass and passes the gradient through unchanged; f
passes the input through unchanged and sums the input's partial gradients in
the backward pass (each rank's heads contribute a part of dL/dx). Both are
built here from PyTorch's ``DTensor`` placements (a ``Partial`` tensor
redistributed to ``Replicate`` is a sum all-reduce), so every rank computes
the same loss and gets exactly the unsharded module's gradients.

**The fused-qkv trap.** ``MultiHeadAttention.qkv`` stacks all of W_Q, then all
of W_K, then all of W_V. Cutting those rows into N contiguous blocks -- what
``torch.distributed.tensor.parallel.ColwiseParallel`` does to any Linear --
gives rank 0 all of W_Q and half of W_K when N = 2, and rank 1 the other half
of W_K and all of W_V: no rank has matching Q, K and V for any head.
:func:`qkv_rows` instead picks, for each rank, the Q rows, the K rows and the
V rows of *its* heads, so the shard is laid out [W_Q_r; W_K_r; W_V_r] exactly
like a smaller layer (:func:`from_heads` builds it, an
``mha.GroupedQueryAttention``), and runs that class's own forward.

**Seeds.** Call ``torch.manual_seed(s)`` with the same ``s`` on every rank
before building the layer: its weights are then the same on every rank (and
:func:`shard_heads` checks that they are). Attention dropout must not be the
same: rank 0's heads and rank 1's are different heads, and in one process they
would draw different masks. So in training mode with dropout, each forward of
a shard draws one number b from the default CPU generator -- the same draw on
every rank, so the ranks' generators stay in step -- and runs its heads under
a forked generator seeded with b + rank (CPU, and the shard's GPU when it has
one). Every head draws its own mask, the default generator is back where it
was after that one draw, and the same ``s`` gives the same masks again.
Megatron-LM keeps a separate tensor-parallel RNG state for the same reason
(megatron/core/tensor_parallel/random.py).

**Ranks that disagree.** A shard's forward is a collective: every rank of the
group calls it, with the same inputs. :func:`shard_heads` compares the layer
(sizes, dtype, a hash of every parameter) across ranks, and each forward
compares x, context, mask, the flags and the cache length (shapes, dtypes and
a fingerprint of their bits, in one small all-gather) before any partial
output is summed. Ranks that disagree, or a rank whose own checks fail, make
*every* rank raise, with a message naming the ranks and what differs: never a
silent sum of unrelated partial outputs, and no rank left waiting. A rank that
never calls the forward at all (it raised before it) is not something the
others can see: they wait for the process group's timeout
(``init_process_group(timeout=...)``; :func:`run_on_ranks` sets it, and stops
every rank as soon as one raises).

**Checkpoints.** ``shard.state_dict()`` is per rank: this rank's heads, with
its rank, N, its heads and the full layer's sizes in the state_dict's metadata;
loading another rank's shard is refused, naming both (case C30).
:func:`full_state_dict`, called on every rank, gathers the whole layer's
state_dict, loadable into an unsharded ``mha.MultiHeadAttention``; a saved
whole layer is sharded again by loading it into the whole layer and calling
:func:`shard_heads` on that (see :class:`ShardedMultiHeadAttention`).

Modules: :mod:`mha.parallel.heads` (:func:`from_heads`, a layer of some
heads), :mod:`mha.parallel.sharding` (the shard), :mod:`mha.parallel.checkpoints`
(its state_dict, and the whole layer's), :mod:`mha.parallel.agree`
(the checks across ranks), :mod:`mha.parallel.launch` (:func:`run_on_ranks`,
which starts N local processes joined by one process group -- gloo on CPU --
and is how the tests and notebook 08 run this package).

Needs torch >= 2.4 (``torch.distributed.tensor``).
"""

from .checkpoints import full_state_dict
from .heads import from_heads
from .launch import run_on_ranks
from .sharding import ShardedMultiHeadAttention, out_columns, qkv_rows, shard_heads

__all__ = ["ShardedMultiHeadAttention", "from_heads", "full_state_dict", "out_columns", "qkv_rows", "run_on_ranks",
           "shard_heads"]
