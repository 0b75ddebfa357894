"""A speed-only path for the GPT's training step: the same numbers as the core, computed faster.

:class:`transformer_lab.models.gpt.GPT` computes with the core (:mod:`transformer_lab.core.gpt`,
what the student writes). In the instructors' and readers' package it computes with this module
instead, which gives the same loss, logits and gradients (to rounding) with fewer passes over
memory: it brings the NumPy GPT's training step close to PyTorch's eager one
(``python -m transformer_lab.course.bench --model gpt`` measures how close, and how much of the
rest is the matrix products, where NumPy's BLAS is slower than torch's). It is
**not part of the course**: the handout leaves it out (``course/package.py``), and there ``GPT``
computes with the student's own core; ``model.use_fast_path = False`` does the same here.
``tests/test_fast_gpt.py`` checks that the two paths agree (values and gradients, float32 and
float64, every configuration :func:`supports` takes).

What it does differently, each the same mathematics as the core (where the time goes, before
and after: issue 26's note):

- **no page faults**: a training step (:func:`gpt_loss`) takes its large arrays from a pool
  that keeps them for the next step. Freshly allocated memory costs a page fault per 4 KiB
  when first written (the allocator returns large blocks to the system when they are freed):
  a quarter of the step's time before the pool (:func:`clear_pools` gives the memory back);
- **2-D throughout**: activations are ``(N, E)`` arrays, ``N = B T``, so every projection is
  one matrix product; the heads are strided views of the projections' outputs, and the
  attention's products write straight into their destinations (no split or merge copies);
- **the sublayers' outputs added to the residual stream by the product itself**: ``x += h W``
  is one BLAS call with beta = 1 (:func:`_gemm_add`), where NumPy's ``matmul`` would first set
  an output to zero and ``+=`` then pass over it again; a product with a bias starts from the
  bias and adds the product to it the same way (as torch's ``addmm``); every array the
  elementwise steps write is contiguous (a column of ones beside the rows, to add a bias inside
  the product, makes NumPy's elementwise steps cost twice as much per element);
- **attention in the transposed layout, causal blocks skipped**: the scores are ``S^T = K Q^T``
  (keys along the rows), so that the softmax's maximum and sum run along the axis NumPy
  reduces fastest (a row of 128 reduced along the last axis costs three times as much); the
  queries go in blocks of 64 and each block meets only the keys up to its end (3/4 of the
  products and softmax at 128 positions); the causal mask is one added table on the diagonal
  block; the scores become the softmax's weights in place, kept for the backward pass (no
  scaling of the heads or their gradients by the sums, passes over rows only Dh long); the
  query heads that share a key/value head are side by side in one product, which
  also sums their key and value gradients; the scale ``1/sqrt(Dh)`` is folded into ``W_q``;
  RoPE is a multiplication by complex numbers (each pair of features one complex number,
  notebook 06's rotation ``exp(-i a)``), written straight into the grouped layout;
- **GELU and SwiGLU with fewer passes, a cache-sized chunk of rows at a time**: the factor 1/2
  moved into the next weight matrix, the forward pass's tanh (or sigmoid) reused in the
  backward pass, every step in place; SwiGLU's gate and up projections in one product; the
  norms' elementwise steps chunked the same way, the layer norm's means subtracted by BLAS's
  rank-one update (NumPy's broadcast of a column over a row costs two to three times a
  contiguous pass when the rows are short);
- **the norms' gain and offset inside the next product's weights**: ``(xhat gamma + beta) W +
  b = xhat (gamma W) + (beta W + b)``, and their gradients from that product's (E, D) weight
  gradient instead of passes over the (N, E) activations;
- **the loss fused with the output projection**: the softmax's exponentials become the
  gradient in place; the embedding's gradient is one product with a one-hot matrix when the
  vocabulary is small.

Parameters and gradients are the flat dicts of ``GPT.params`` (``"layers.0.attn.W_qkv"``, ...).
Tiled attention (``attention_block_size``) is not covered: there the core runs (its point is
memory, not speed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from scipy.linalg import blas
from scipy.special import erf

_TANH_C = math.sqrt(2 / math.pi)  # GELU's tanh form: tanh(C (x + K x^3))
_TANH_K = 0.044715


def supports(config) -> bool:
    """Whether this path computes a GPT with ``config`` (else the core does)."""
    return (config.attention_block_size is None and config.norm in ("layer", "rms")
            and config.mlp in ("gelu_tanh", "gelu", "relu", "swiglu")
            and config.positional in ("learned", "sinusoidal", "rope", "none")
            and np.dtype(config.dtype) in (np.float32, np.float64))


# --------------------------------------------------------------------------------------------
# Where the step's arrays come from


#: Where the step's arrays start: a multiple of 64 bytes (a cache line, an AVX-512 register).
_ALIGN = 64


def _empty(shape, dtype):
    """``np.empty(shape, dtype)``, starting on a multiple of :data:`_ALIGN` bytes. NumPy's own
    arrays started 16, 32 or 48 bytes past one here, and a vector load then straddles two cache
    lines: a float32 multiply over (256, 384) arrays took 0.31 ns per element 16 bytes past,
    0.14 aligned (one thread; 0.68 and 0.55 over (1024, 1024) arrays, which miss the cache)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = np.empty(nbytes + _ALIGN, np.uint8)
    start = -buffer.ctypes.data % _ALIGN
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


class _Pool:
    """Arrays by (shape, dtype): ``pool(shape, dtype)`` hands out one no other caller holds;
    :meth:`release` takes back those of the step for the next one (and only those: a pool keeps
    one step's arrays, whatever the shapes of the steps before)."""

    def __init__(self):
        self.free: dict = {}
        self.used: list = []

    def __call__(self, shape, dtype):
        key = (shape, np.dtype(dtype))
        stack = self.free.get(key)
        a = stack.pop() if stack else _empty(shape, dtype)
        self.used.append((key, a))
        return a

    def release(self) -> None:
        free: dict = {}
        for key, a in self.used:
            free.setdefault(key, []).append(a)
        self.free, self.used = free, []


_POOLS: list[_Pool] = []  # one per step running at once (threads)


def _fresh(shape, dtype):
    """A new array, not the pool's: what the step hands out (its gradients) or keeps."""
    return _empty(shape, dtype)


def _copy(a):
    """A C-contiguous copy of a, from :func:`_fresh`."""
    out = _fresh(a.shape, a.dtype)
    out[...] = a
    return out


def _zeros(shape, dtype):
    """Zeros, from :func:`_fresh`."""
    out = _fresh(shape, dtype)
    out[...] = 0
    return out


def clear_pools() -> None:
    """Give back the memory the pools keep between training steps (the arrays of one step:
    about 80 MB for the character model's default)."""
    _POOLS.clear()


# --------------------------------------------------------------------------------------------
# Products with their biases; the norms, with the product that follows them


def _matmul(a, b, alloc):
    return np.matmul(a, b, out=alloc((a.shape[0], b.shape[1]), a.dtype))


def _product(a, W, b, alloc):
    """``a @ W + b`` (b None: no bias) in an array of the pool: with a bias, the bias is written
    first and the product added to it by one BLAS call with beta = 1 (as torch's ``addmm``)."""
    if b is None:
        return _matmul(a, W, alloc)
    y = alloc((a.shape[0], W.shape[1]), a.dtype)
    y[...] = b
    return _gemm_add(a, W, y)


def _fortran(a):
    """a (2-D) as BLAS takes it: (the array in column-major order, whether to transpose it)."""
    return (a.T, False) if a.flags.c_contiguous else (a, True)


def _gemm_add(a, b, c):
    """c += a @ b in place, c C-contiguous: one BLAS call with beta = 1 (NumPy's matmul would
    first set an output to zero, and the sum pass over c again)."""
    gemm = blas.sgemm if c.dtype == np.float32 else blas.dgemm
    bt, tb = _fortran(b)  # c^T = b^T a^T in column-major order
    at, ta = _fortran(a)
    ct = c.T
    out = gemm(1.0, bt, at, beta=1.0, c=ct, overwrite_c=True, trans_a=tb, trans_b=ta)
    if out is not ct:  # the wrapper wrote a copy: c + a b, in column order
        c[...] = out.T
    return c


_CHUNK_BYTES = 1 << 18


def _chunks(N, F, itemsize):
    """Row ranges of an (N, F) array, about _CHUNK_BYTES each: a chain of elementwise steps on
    one range stays in the core's cache (a quarter faster than whole-array passes here)."""
    rows = max(8, _CHUNK_BYTES // (F * itemsize))
    return [slice(i, min(i + rows, N)) for i in range(0, N, rows)]


_ONES: dict = {}


def _ones(n, dtype):
    """A row of n ones (1, n): ``_ones(n) @ a`` sums the rows of a, ``a @ _ones(n)[0]`` its
    columns -- a matrix-vector product, several times faster than NumPy's sum along an axis
    whose rows are short."""
    key = (n, np.dtype(dtype))
    if key not in _ONES:
        if len(_ONES) > 64:
            _ONES.clear()
        _ONES[key] = np.ones((1, n), dtype)
    return _ONES[key]


def _rank1_add(u, v, a):
    """a += u v^T in place, a C-contiguous (E, D): BLAS's rank-one update, one pass."""
    ger = blas.sger if a.dtype == np.float32 else blas.dger
    at = a.T
    out = ger(1.0, v, u, a=at, overwrite_a=True)  # a^T += v u^T, column-major
    if out is not at:  # the wrapper wrote a copy (an object of its own)
        a[...] = out.T
    return a


def _column_sums(a):
    """The sums of a's columns (a bias's gradient), as :func:`_ones` computes them."""
    return (_ones(a.shape[0], a.dtype) @ a)[0]


def _norm_params(P, prefix):
    return P[prefix + ".gamma"], P.get(prefix + ".beta")


def _norm_linear_forward(x, norm, W, b, c, alloc):
    """``norm(x) @ W + b`` for x (N, E) -> y (N, D), and the cache of
    :func:`_norm_linear_backward` (norm None: ``x @ W + b``).

    The norm's gain and offset go into the product's weights: ``(xhat gamma + beta) @ W + b =
    xhat @ (gamma W) + (beta @ W + b)``, an (E, D) product instead of two passes over (N, E).
    """
    if norm is None:  # no norm before the product (the encoder-decoder's post-norm layers)
        return _product(x, W, b, alloc), (x, None, W, W, None, None, b is not None, None)
    gamma, beta = norm
    N, E = x.shape
    W_in = np.multiply(gamma[:, None], W, out=alloc(W.shape, W.dtype))  # (E, D)
    b_in = None if beta is None and b is None else \
        (0 if beta is None else beta @ W) + (0 if b is None else b)
    rstd = alloc((N,), x.dtype)
    xhat = alloc((N, E), x.dtype)
    for r in _chunks(N, E, x.dtype.itemsize):
        _normalize_rows(x[r], xhat[r], rstd[r], c.norm == "layer", c.eps)
    y = _product(xhat, W_in, b_in, alloc)
    return y, (xhat, rstd, W, W_in, gamma, beta, b is not None, c.norm == "layer")


def _norm_linear_backward(dy, cache, dx, alloc):
    """Gradients of :func:`_norm_linear_forward`: the input's added to dx (N, E) in place;
    returns those of W, b (or None), gamma and beta (or None).

    From ``A = xhat^T dy`` (E, D) and the column sums ``s = 1^T dy`` (D,), one product with
    the forward pass's ``[xhat, 1]``: ``dW = gamma A + beta s``, ``db = s``,
    ``dgamma = sum_d W A``, ``dbeta = W s`` -- (E, D) work, not (N, E). With
    ``g = dy @ (gamma W)^T`` (the norm's output gradient times gamma):
    ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` (RMSNorm: without ``mean(g)``).
    """
    xhat, rstd, W, W_in, gamma, beta, with_b, centred = cache
    if rstd is None:  # no norm: xhat is the product's input
        dW = _matmul(xhat.T, dy, _fresh)
        _gemm_add(dy, W.T, dx)
        return dW, _column_sums(dy) if with_b else None, None, None
    N, E = xhat.shape
    dt = dy.dtype
    dW = _matmul(xhat.T, dy, _fresh)  # (E, D): A, then gamma A + beta s in place
    sums = _column_sums(dy) if with_b or beta is not None else None
    db = sums if with_b else None
    dgamma = np.einsum("ed,ed->e", W, dW)
    dW *= gamma[:, None]
    if beta is not None:
        _rank1_add(beta, sums, dW)
    dbeta = W @ sums if beta is not None else None
    g = np.matmul(dy, W_in.T, out=alloc((N, E), dt))
    rows = _chunks(N, E, dt.itemsize)
    scratch = alloc((rows[0].stop, E), dt)
    for r in rows:
        _normalize_rows_backward(g[r], xhat[r], rstd[r], scratch[:r.stop - r.start], centred)
        dx[r] += g[r]
    return dW, db, dgamma, dbeta


def _normalize_rows(x, xhat, rstd, centred, eps):
    """One chunk of rows x (n, E) normalised into xhat (n, E), their ``1 / sqrt(var + eps)``
    into rstd (n,): layer norm (centred: the means subtracted by BLAS's rank-one update) or
    RMSNorm (the mean square instead of the variance)."""
    E = x.shape[1]
    inv_e = 1.0 / E
    ones = _ones(E, x.dtype)[0]
    if centred:
        neg_mean = x @ ones
        neg_mean *= -inv_e
        xhat[...] = x
        _rank1_add(neg_mean, ones, xhat)  # x - mean, by rows
        np.einsum("ij,ij->i", xhat, xhat, out=rstd)
    else:
        np.einsum("ij,ij->i", x, x, out=rstd)
    rstd *= inv_e
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    np.multiply(xhat if centred else x, rstd[:, None], out=xhat)


def _normalize_rows_backward(g, xhat, rstd, scratch, centred):
    """The gradient of a chunk's normalised rows (times gamma) g (n, E) turned into that of
    their input, in place: ``rstd (g - mean(g) - xhat mean(g xhat))`` (RMSNorm: without
    ``mean(g)``); scratch: an (n, E) array to use."""
    E = g.shape[1]
    inv_e = 1.0 / E
    mean_gx = np.einsum("ij,ij->i", g, xhat)
    mean_gx *= inv_e
    if centred:
        ones = _ones(E, g.dtype)[0]
        neg_mean_g = g @ ones
        neg_mean_g *= -inv_e
        _rank1_add(neg_mean_g, ones, g)
    np.multiply(xhat, mean_gx[:, None], out=scratch)
    g -= scratch
    g *= rstd[:, None]


def _set_norm_grads(grads, prefix, dgamma, dbeta):
    if dgamma is None:  # no norm
        return
    grads[prefix + ".gamma"] = dgamma
    if dbeta is not None:
        grads[prefix + ".beta"] = dbeta


# --------------------------------------------------------------------------------------------
# Causal self-attention: grouped-query heads, RoPE, the scores transposed


_MASKS: dict = {}
_BLOCK = 64  # queries per column block of the scores (see _blocks)


def _mask(w, n_rep, dtype):
    """(w, w n_rep): -inf where key j comes after query i (column i n_rep + r), else 0."""
    key = (w, n_rep, np.dtype(dtype))
    if key not in _MASKS:
        if len(_MASKS) > 64:
            _MASKS.clear()
        blocked = np.arange(w)[:, None] > np.arange(w)[None, :]
        _MASKS[key] = np.repeat(np.where(blocked, -np.inf, 0.0).astype(dtype), n_rep, axis=1)
    return _MASKS[key]


def _blocks(T):
    """The queries in blocks of _BLOCK: block (c0, c1) attends to the keys 0 .. c1 - 1 only,
    so the scores of later keys (all masked) are never computed: at T = 128, 3/4 of the work."""
    return [(c0, min(c0 + _BLOCK, T)) for c0 in range(0, T, _BLOCK)]


#: exp of a score in [-40, 40] is a normal float32 (down to 4e-18), and sums of 10^4 of them
#: times values up to 10^17 stay finite; the trained character model's bound is about 35
_EXP_SAFE = 40.0


def _scores_bounded(q, k, Dh):
    """Whether every score ``q_i . k_j`` lies in [-_EXP_SAFE, _EXP_SAFE] (Cauchy-Schwarz:
    ``|q_i . k_j| <= |q_i| |k_j|``, the largest norms of all heads): then the softmax needs
    no shift by the maximum -- no exponential overflows, and each query's sum holds its own
    key's term, at least exp(-_EXP_SAFE). RoPE rotates pairs of features, which keeps norms.
    q (N, H Dh) (already scaled), k (M, Hkv Dh): the heads side by side."""
    q = q.reshape(q.shape[0], -1, Dh)
    k = k.reshape(k.shape[0], -1, Dh)
    q2 = np.einsum("nhd,nhd->nh", q, q).max()
    k2 = np.einsum("nhd,nhd->nh", k, k).max()
    return bool(q2 * k2 < _EXP_SAFE ** 2)


def _scaled(W, b, cols, scale, alloc):
    """Copies of W (from ``alloc``) and b (or None) with the columns ``cols`` times ``scale``:
    the queries' weights with the attention's scale folded in, so that they come out scaled."""
    W_s = alloc(W.shape, W.dtype)
    W_s[...] = W
    W_s[:, cols] *= scale
    if b is not None:
        b = b.copy()
        b[cols] *= scale
    return W_s, b


def _attention_forward(x, P, p, norm, c, B, T, rope_w, alloc, into=None):
    """Causal self-attention of norm1(x), x (N, E) -> (N, E), cache (the output added to
    ``into`` instead, when given: then None, cache).

    Layout: the queries of the H / Hkv = n_rep heads that share a key/value head are side by
    side, position-major, ``q[b, g, i n_rep + r]`` (the grouped layout); with n_rep = 1 and no
    RoPE they are a view of the projection's output. The scores of a column block of queries
    are ``st[b, g, j, i n_rep + r] = k_j . q_(i, r)``, keys along the rows; ``st`` becomes the
    softmax's weights in place (each column divided by its sum: a pass whose inner loop runs
    along a row of st, faster here than dividing the heads afterwards, whose rows are only Dh
    long), and the cache keeps them.
    """
    E, H, Hkv, Dh = c.d_model, c.num_heads, c.num_kv_heads, c.head_dim
    n_rep, kv, dt = H // Hkv, Hkv * Dh, x.dtype
    scale = 1.0 / math.sqrt(Dh)
    W_s, b_s = _scaled(P[p + "W_qkv"], P.get(p + "b_qkv"), slice(0, E), scale, alloc)
    qkv, c_qkv = _norm_linear_forward(x, norm, W_s, b_s, c, alloc)  # (N, E + 2 kv)
    q5 = qkv[:, :E].reshape(B, T, Hkv, n_rep, Dh)  # views of qkv
    v = qkv[:, E + kv:].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)  # (B, Hkv, T, Dh)
    if rope_w is not None:  # rotated copies, the queries in the grouped layout
        cdt = rope_w.dtype
        qc = qkv.view(cdt)[:, :E // 2].reshape(B, T, Hkv, n_rep, Dh // 2)
        kc = qkv.view(cdt)[:, E // 2:(E + kv) // 2].reshape(B, T, Hkv, Dh // 2)
        q = alloc((B, Hkv, T, n_rep, Dh // 2), cdt)
        np.multiply(qc.transpose(0, 2, 1, 3, 4), rope_w[:, None], out=q)
        k = alloc((B, Hkv, T, Dh // 2), cdt)
        np.multiply(kc.transpose(0, 2, 1, 3), rope_w, out=k)
        q = q.view(dt).reshape(B, Hkv, T * n_rep, Dh)
        k = k.view(dt)
    else:
        k = qkv[:, E:E + kv].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)
        if n_rep == 1:
            q = q5.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # a view
        else:
            q = alloc((B, Hkv, T, n_rep, Dh), dt)
            q[...] = q5.transpose(0, 2, 1, 3, 4)
            q = q.reshape(B, Hkv, T * n_rep, Dh)
    shift = not _scores_bounded(qkv[:, :E], qkv[:, E:E + kv], Dh)
    b_o = P.get(p + "b_o")
    merged = alloc((B * T, E), dt)  # the heads side by side
    merged4 = merged.reshape((B, T, H, Dh), copy=False)
    blocks = []
    for c0, c1 in _blocks(T):
        cols = slice(c0 * n_rep, c1 * n_rep)
        st = np.matmul(k[:, :, :c1], q[:, :, cols].swapaxes(-1, -2),
                       out=alloc((B, Hkv, c1, (c1 - c0) * n_rep), dt))
        st[:, :, c0:] += _mask(c1 - c0, n_rep, dt)
        if shift:  # softmax over the keys
            st -= st.max(axis=-2, keepdims=True)
        np.exp(st, out=st)
        inv = np.matmul(_ones(c1, dt), st)  # the sums over the keys (B, Hkv, 1, w n_rep)
        np.reciprocal(inv, out=inv)
        st *= inv  # the softmax's weights P^T
        blocks.append(st)
        if n_rep == 1:
            heads = merged4[:, c0:c1].transpose(0, 2, 1, 3)
            np.matmul(st.swapaxes(-1, -2), v[:, :, :c1], out=heads)
        else:
            heads = np.matmul(st.swapaxes(-1, -2), v[:, :, :c1],
                              out=alloc((B, Hkv, (c1 - c0) * n_rep, Dh), dt))
            merged4[:, c0:c1].reshape((B, c1 - c0, Hkv, n_rep, Dh), copy=False)[...] = \
                heads.reshape(B, Hkv, c1 - c0, n_rep, Dh).transpose(0, 2, 1, 3, 4)
    out = _output(merged, P[p + "W_o"], b_o, into, alloc)
    return out, (c_qkv, q, k, v, blocks, merged, rope_w, scale)


def _attention_backward(dout, cache, P, p, norm_prefix, c, B, T, dx, grads, alloc):
    """Gradients of :func:`_attention_forward`: the input's added to dx (N, E) in place."""
    c_qkv, q, k, v, blocks, merged, rope_w, scale = cache
    E, H, Hkv, Dh = c.d_model, c.num_heads, c.num_kv_heads, c.head_dim
    n_rep, kv, dt = H // Hkv, Hkv * Dh, dout.dtype
    b_o = P.get(p + "b_o")
    grads[p + "W_o"] = _matmul(merged.T, dout, _fresh)
    if b_o is not None:
        grads[p + "b_o"] = _column_sums(dout)
    dmerged = np.matmul(dout, P[p + "W_o"].T, out=alloc((B * T, E), dt))
    if n_rep == 1:
        dheads = dmerged.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # a view
    else:
        dheads = alloc((B, Hkv, T, n_rep, Dh), dt)
        dheads[...] = dmerged.reshape(B, T, Hkv, n_rep, Dh).transpose(0, 2, 1, 3, 4)
        dheads = dheads.reshape(B, Hkv, T * n_rep, Dh)
    dqkv = alloc((B * T, E + 2 * kv), dt)
    dq5 = dqkv[:, :E].reshape(B, T, Hkv, n_rep, Dh)
    dk4 = dqkv[:, E:E + kv].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)
    dv = dqkv[:, E + kv:].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)
    # where dq and dk go: straight into dqkv, or first where they are rotated / regrouped
    dq = alloc(q.shape, dt) if rope_w is not None or n_rep > 1 else \
        dq5.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)
    dk = alloc(k.shape, dt) if rope_w is not None else dk4
    # sum_j P_ij dP_ij = dO_i . O_i, per query and head (the heads' output O is in merged),
    # in the grouped layout (B, Hkv, 1, T n_rep)
    d_out = np.einsum("nhd,nhd->nh", dmerged.reshape(B * T, H, Dh), merged.reshape(B * T, H, Dh))
    d_out = d_out.reshape(B, T, Hkv, n_rep).transpose(0, 2, 1, 3).reshape(B, Hkv, 1, T * n_rep)
    for (c0, c1), st in reversed(list(zip(_blocks(T), blocks, strict=True))):
        cols = slice(c0 * n_rep, c1 * n_rep)
        first = c1 == T  # the last block reaches every key: it writes, the others add
        dh = dheads[:, :, cols]
        # dV = P^T dO; dS^T = P^T * (dP^T - sum_j P dP), dP^T = v dO^T
        _matmul_into(st, dh, dv[:, :, :c1], first, alloc)  # summed over a group's heads
        dst = np.matmul(v[:, :, :c1], dh.swapaxes(-1, -2), out=alloc(st.shape, dt))
        dst -= d_out[..., cols]
        dst *= st  # dS^T
        np.matmul(dst.swapaxes(-1, -2), k[:, :, :c1], out=dq[:, :, cols])
        _matmul_into(dst, q[:, :, cols], dk[:, :, :c1], first, alloc)
    if rope_w is not None:  # rotate back: by the conjugate
        cdt = rope_w.dtype
        back = np.conj(rope_w)
        dqc = dqkv.view(cdt)[:, :E // 2].reshape(B, T, Hkv, n_rep, Dh // 2)
        dkc = dqkv.view(cdt)[:, E // 2:(E + kv) // 2].reshape(B, T, Hkv, Dh // 2)
        np.multiply(dq.view(cdt).reshape(B, Hkv, T, n_rep, Dh // 2), back[:, None],
                    out=dqc.transpose(0, 2, 1, 3, 4))
        np.multiply(dk.view(cdt), back, out=dkc.transpose(0, 2, 1, 3))
    elif n_rep > 1:
        dq5[...] = dq.reshape(B, Hkv, T, n_rep, Dh).transpose(0, 2, 1, 3, 4)
    dW, db, dgamma, dbeta = _norm_linear_backward(dqkv, c_qkv, dx, alloc)
    dW[:, :E] *= scale  # W_q was used scaled
    grads[p + "W_qkv"] = dW
    if P.get(p + "b_qkv") is not None:
        db[:E] *= scale
        grads[p + "b_qkv"] = db
    _set_norm_grads(grads, norm_prefix, dgamma, dbeta)


def _output(h, W, b, into, alloc):
    """A sublayer's output ``h W + b`` (N, E); or added to ``into`` (the residual stream) in
    place, and None."""
    if into is not None:
        if b is not None:
            into += b
        _gemm_add(h, W, into)
        return None
    return _product(h, W, b, alloc)


def _matmul_into(a, b, out, first, alloc):
    """out = a @ b (first) or out += a @ b."""
    if first:
        np.matmul(a, b, out=out)
    else:
        out += np.matmul(a, b, out=alloc(out.shape, out.dtype))


# --------------------------------------------------------------------------------------------
# The feed-forward networks


def _mlp_forward(x, P, p, norm, kind, c, alloc, grad=True, into=None):
    """The feed-forward network of norm2(x), x (N, E) -> (N, E), cache (or added to ``into``:
    None, cache, as :func:`_attention_forward`).

    The activation's derivative is computed here (unless ``grad`` is False: no backward pass
    follows), a chunk of rows at a time while its inputs are in the cache, and kept for the
    backward pass (one multiplication there).
    """
    N, dt = x.shape[0], x.dtype
    if kind == "swiglu":  # m = silu(a) * u; keeps silu(a) and u silu'(a)
        F = P[p + "W_gate"].shape[1]
        W_gate = P[p + "W_gate"]
        W = np.concatenate([W_gate, P[p + "W_up"]], axis=1,
                           out=alloc((W_gate.shape[0], 2 * F), W_gate.dtype))  # (E, 2F)
        au, c_in = _norm_linear_forward(x, norm, W, None, c, alloc)
        silu, w, m = (alloc((N, F), dt) for _ in range(3))
        rows = _chunks(N, F, dt.itemsize)
        s = alloc((rows[0].stop, F), dt)
        for r in rows:
            a, u, s_, silu_, w_ = au[r, :F], au[r, F:], s[:r.stop - r.start], silu[r], w[r]
            np.multiply(a, 0.5, out=s_)
            np.tanh(s_, out=s_)
            s_ += 1
            s_ *= 0.5  # sigmoid(a)
            np.multiply(a, s_, out=silu_)
            np.multiply(silu_, u, out=m[r])
            if not grad:
                continue
            np.multiply(silu_, s_, out=w_)  # silu'(a) = s + silu (1 - s)
            np.subtract(silu_, w_, out=w_)
            w_ += s_
            w_ *= u
        return _output(m, P[p + "W_down"], None, into, alloc), (kind, c_in, silu, w, m)
    a, c_in = _norm_linear_forward(x, norm, P[p + "W1"], P.get(p + "b1"), c, alloc)  # (N, F)
    F = a.shape[1]
    b2 = P.get(p + "b2")
    g = alloc((N, F), dt)
    if kind == "relu":
        np.maximum(a, 0, out=g)
        return _output(g, P[p + "W2"], b2, into, alloc), (kind, c_in, a, g, P[p + "W2"])
    # g = a t = 2 gelu(a), t = 1 + tanh(a (C + C K a^2)) or 1 + erf(a / sqrt 2); keeps dg/da
    w = alloc((N, F), dt)
    rows = _chunks(N, F, dt.itemsize)
    t, u = (alloc((rows[0].stop, F), dt) for _ in range(2))
    for r in rows:
        a_, w_ = a[r], w[r]
        t_, u_ = t[:r.stop - r.start], u[:r.stop - r.start]
        if kind == "gelu_tanh":
            np.multiply(a_, a_, out=u_)
            u_ *= _TANH_C * _TANH_K
            u_ += _TANH_C  # poly = C + C K a^2
            np.multiply(u_, a_, out=t_)
            np.tanh(t_, out=t_)
            t_ += 1
            np.multiply(t_, a_, out=g[r])
            if not grad:
                continue
            # dg/da = t + a (1 - tanh^2) C (1 + 3 K a^2), with a C (1 + 3 K a^2) =
            # a (3 poly - 2 C) and 1 - tanh^2 = (2 - t) t
            np.multiply(u_, 3, out=w_)
            w_ -= 2 * _TANH_C
            w_ *= a_
            np.subtract(2, t_, out=u_)
            u_ *= t_
            w_ *= u_
        else:
            np.multiply(a_, 1 / math.sqrt(2), out=t_)
            erf(t_, out=t_)
            t_ += 1
            np.multiply(t_, a_, out=g[r])
            if not grad:
                continue
            # dg/da = t + a sqrt(2 / pi) exp(-a^2 / 2)
            np.multiply(a_, a_, out=w_)
            w_ *= -0.5
            np.exp(w_, out=w_)
            w_ *= a_
            w_ *= math.sqrt(2 / math.pi)
        w_ += t_
    W2 = P[p + "W2"]
    W2_half = np.multiply(W2, 0.5, out=alloc(W2.shape, W2.dtype))  # g is 2 gelu
    return _output(g, W2_half, b2, into, alloc), (kind, c_in, w, g, W2_half)


def _mlp_backward(dout, cache, P, p, norm_prefix, dx, grads, alloc):
    """Gradients of :func:`_mlp_forward`: the input's added to dx (N, E) in place."""
    kind, c_in = cache[:2]
    N, dt = dout.shape[0], dout.dtype
    if kind == "swiglu":
        silu, w, m = cache[2:]
        F = silu.shape[1]
        grads[p + "W_down"] = _matmul(m.T, dout, _fresh)
        dm = np.matmul(dout, P[p + "W_down"].T, out=alloc((N, F), dt))
        da = alloc((N, 2 * F), dt)
        np.multiply(dm, w, out=da[:, :F])  # the gate's gradient
        np.multiply(dm, silu, out=da[:, F:])  # the up projection's
    else:
        a_or_w, g, W2_used = cache[2:]  # W2_used: W2, or W2 / 2 after GELU (g = 2 gelu)
        F = g.shape[1]
        G = _matmul(g.T, dout, _fresh)
        if P.get(p + "b2") is not None:
            grads[p + "b2"] = _column_sums(dout)
        da = np.matmul(dout, W2_used.T, out=alloc((N, F), dt))  # of g
        if kind == "relu":
            # (np.copyto with where= costs 10 to 20 times as much as this product here)
            np.multiply(da, a_or_w > 0, out=da)
        else:
            G *= 0.5
            da *= a_or_w  # dg/da
        grads[p + "W2"] = G
    dW, db, dgamma, dbeta = _norm_linear_backward(da, c_in, dx, alloc)
    if kind == "swiglu":
        F = dW.shape[1] // 2
        grads[p + "W_gate"], grads[p + "W_up"] = _copy(dW[:, :F]), _copy(dW[:, F:])
    else:
        grads[p + "W1"] = dW
        if P.get(p + "b1") is not None:
            grads[p + "b1"] = db
    _set_norm_grads(grads, norm_prefix, dgamma, dbeta)


# --------------------------------------------------------------------------------------------
# The model


class FastCache:
    """What :func:`gpt_forward` keeps for :func:`gpt_backward`."""

    __slots__ = ("c", "params", "ids", "B", "T", "layers", "final")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def _rope_w(rope, dtype):
    if rope is None:
        return None
    cos, sin = rope
    cdt = np.complex64 if np.dtype(dtype) == np.float32 else np.complex128
    return (cos - 1j * sin).astype(cdt)  # exp(-i a): notebook 06's rotation


def _dropout(out, c, rng):
    """Training with dropout (``rng``), as the core's blocks: each sublayer's output dropped
    with probability ``c.dropout``, the others scaled by 1 / (1 - p), from the same draws in the
    same order (``core.layers.dropout_forward``) -> the cache: (mask, scale) or None."""
    if rng is None or c.dropout == 0:
        return None
    keep = rng.random(out.shape) >= c.dropout
    scale = out.dtype.type(1 / (1 - c.dropout))
    out *= keep
    out *= scale
    return keep, scale


def _add_output(x, out, c, rng):
    """x += a sublayer's output (None: the sublayer added it itself), through dropout when
    training with it -> the dropout's cache (None without)."""
    if out is None:
        return None
    cache = _dropout(out, c, rng)
    x += out
    return cache


def _dropout_backward(dout, cache, alloc):
    if cache is None:
        return dout
    keep, scale = cache
    d = np.multiply(dout, keep, out=alloc(dout.shape, dout.dtype))
    d *= scale
    return d


def _forward(P, ids, c, pe, rope, alloc, rng=None, grad=True):
    B, T = ids.shape
    N = B * T
    table = P["embed.W"]
    flat_ids = ids.reshape(-1)
    x = np.take(table, flat_ids, axis=0, out=alloc((N, table.shape[1]), table.dtype))
    positions = P.get("pos.W", pe)  # learned, sinusoidal (pe) or none
    if positions is not None:
        x.reshape(B, T, -1)[...] += positions[:T]
    rope_w = _rope_w(rope, x.dtype)
    layers = []
    # without dropout, each sublayer adds its output to x in its own product
    into = x if rng is None or c.dropout == 0 else None
    for i in range(c.num_layers):
        p = f"layers.{i}."
        a, c_att = _attention_forward(x, P, p + "attn.", _norm_params(P, p + "norm1"), c, B, T,
                                      rope_w, alloc, into=into)
        drop1 = _add_output(x, a, c, rng)
        m, c_mlp = _mlp_forward(x, P, p + "mlp.", _norm_params(P, p + "norm2"), c.mlp, c,
                                alloc, grad, into=into)
        drop2 = _add_output(x, m, c, rng)
        layers.append((c_att, drop1, c_mlp, drop2))
    # logits = norm(x) @ table^T
    logits, c_out = _norm_linear_forward(x, _norm_params(P, "norm"), table.T, None, c, alloc)
    cache = FastCache(c=c, params=dict(P), ids=flat_ids, B=B, T=T, layers=layers, final=c_out)
    return logits, cache


def _backward(dlogits, cache, alloc):
    """dlogits (N, V) -> the gradients, keyed and ordered like the forward pass's params."""
    c, P, B, T = cache.c, cache.params, cache.B, cache.T
    grads: dict[str, np.ndarray] = {}
    dx = alloc((B * T, c.d_model), dlogits.dtype)
    dx[...] = 0
    dW, _, dgamma, dbeta = _norm_linear_backward(dlogits, cache.final, dx, alloc)
    d_table = _copy(dW.T)  # the output projection's share (V, E)
    _set_norm_grads(grads, "norm", dgamma, dbeta)
    for i in reversed(range(c.num_layers)):
        p = f"layers.{i}."
        c_att, drop1, c_mlp, drop2 = cache.layers[i]
        _mlp_backward(_dropout_backward(dx, drop2, alloc), c_mlp, P, p + "mlp.", p + "norm2",
                      dx, grads, alloc)
        _attention_backward(_dropout_backward(dx, drop1, alloc), c_att, P, p + "attn.",
                            p + "norm1", c, B, T, dx, grads, alloc)
    _embedding_backward(cache.ids, dx, d_table, alloc)
    grads["embed.W"] = d_table
    if "pos.W" in P:
        d_pos = _zeros(P["pos.W"].shape, dx.dtype)
        d_pos[:T] = dx.reshape(B, T, -1).sum(axis=0)
        grads["pos.W"] = d_pos
    return {k: grads[k] for k in P}


def _embedding_backward(ids, dx, d_table, alloc):
    """d_table[ids[n]] += dx[n] for every n, in place."""
    V, N = d_table.shape[0], ids.size
    if V <= 4 * dx.shape[1]:  # one product with a one-hot matrix (V, N) @ (N, E)
        onehot = alloc((V, N), dx.dtype)
        onehot[...] = 0
        onehot[ids, np.arange(N)] = 1
        _gemm_add(onehot, dx, d_table)
    else:
        np.add.at(d_table, ids, dx)


def gpt_forward(params: Mapping[str, np.ndarray], ids: np.ndarray, config, pe=None,
                rope=None):
    """Logits (B, T, V) of ids (B, T), as :func:`transformer_lab.core.gpt.gpt_forward`.

    params: the flat dict of ``GPT.params``; pe: the sinusoidal table (L, E) or None; rope:
    RoPE's (cos, sin) (T, Dh/2) or None  ->  logits, a :class:`FastCache` for
    :func:`gpt_backward`.
    """
    logits, cache = _forward(params, ids, config, pe, rope, _fresh)
    return logits.reshape(*ids.shape, -1), cache


def gpt_backward(dlogits: np.ndarray, cache: FastCache) -> dict[str, np.ndarray]:
    """Gradients of every parameter (the keys of the forward pass's ``params``, in their order)
    from dlogits (B, T, V)."""
    return _backward(dlogits.reshape(cache.B * cache.T, -1), cache, _fresh)


def gpt_loss(params: Mapping[str, np.ndarray], ids: np.ndarray, config, pe=None, rope=None,
             compute_grads: bool = True, rng=None):
    """The next-token loss of ids (B, T) and its gradients, as
    :func:`transformer_lab.core.gpt.gpt_loss` (``rng``: training with the config's dropout):
    ``(loss, grads)`` (grads None without ``compute_grads``). Its arrays come from a pool kept
    for the next call."""
    pool = _POOLS.pop() if _POOLS else _Pool()
    try:
        return _loss(params, ids, config, pe, rope, compute_grads, pool, rng)
    finally:
        pool.release()
        _POOLS.append(pool)


def _loss(params, ids, config, pe, rope, compute_grads, alloc, rng):
    logits, cache = _forward(params, ids, config, pe, rope, alloc, rng, compute_grads)
    B, T = ids.shape
    z = logits.reshape(B, T, -1)[:, :-1]  # (B, T-1, V): position t predicts ids[:, t + 1]
    targets = ids[:, 1:, None]
    z -= z.max(axis=-1, keepdims=True)
    picked = np.take_along_axis(z, targets, axis=-1)[..., 0]
    np.exp(z, out=z)
    total = z.sum(axis=-1)
    count = B * (T - 1)
    loss = float(np.sum(np.log(total.astype(np.float64)) - picked)) / count
    if not compute_grads:
        return loss, None
    z *= ((1.0 / count) / total)[..., None]  # softmax / count ...
    np.put_along_axis(z, targets, np.take_along_axis(z, targets, axis=-1) - 1.0 / count,
                      axis=-1)  # ... minus the one-hot target / count
    logits.reshape(B, T, -1)[:, -1] = 0  # the last position predicts nothing
    return loss, _backward(logits, cache, alloc)
