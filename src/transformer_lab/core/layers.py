"""Layers: the pieces every later part of the Transformer is made of.

Each operation is a pair ``op_forward(...) -> (out, cache)`` and ``op_backward(dout, cache)``.
A backward function returns the gradients of the forward's array inputs, in order, followed by
a dict ``grads`` keyed like the operation's parameters when it has any
(``linear_backward(dout, cache) -> (dx, {"W": dW, "b": db})``). Shapes are in every docstring;
weights use the NumPy layout ``y = x @ W + b`` with ``W`` of shape ``(D_in, D_out)``.

This is the code you write as you go through the notebooks (``transformer_lab/syllabus.py``
says which notebook teaches which function). It checks nothing: the model, the ``from_torch``
twins and the functions of ``transformer_lab.layers`` check their inputs once, before calling
it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

# --------------------------------------------------------------------------------------------
# Linear map (00_gradients; any leading axes: 03_minibatching)


def linear_forward(x, W, b=None):
    """Affine map over the last axis: ``out = x @ W + b``.

    x: (..., D_in); W: (D_in, D_out); b: (D_out,) or None  ->  out: (..., D_out)
    """
    ### BEGIN SOLUTION 00 §6, 03 §3
    out = x.reshape(-1, x.shape[-1]) @ W  # (N, D_out), N = the leading axes together
    if b is not None:
        out += b
    out = out.reshape(*x.shape[:-1], W.shape[1])  # (..., D_out)
    ### END SOLUTION
    return out, (x, W, b)


def linear_backward(dout, cache):
    """Gradients of :func:`linear_forward`.

    dout: (..., D_out)  ->  dx: (..., D_in), grads: {"W": (D_in, D_out), "b": (D_out,)}
    (no "b" without a bias). The weight gradient sums over every leading axis.
    """
    x, W, b = cache
    ### BEGIN SOLUTION 00 §6, 03 §3
    dout2 = dout.reshape(-1, dout.shape[-1])  # (N, D_out)
    dx = (dout2 @ W.T).reshape(x.shape)  # (..., D_in)
    grads = {"W": x.reshape(-1, x.shape[-1]).T @ dout2}
    if b is not None:
        grads["b"] = dout2.sum(axis=0)
    ### END SOLUTION
    return dx, grads


# --------------------------------------------------------------------------------------------
# Activations (ReLU: 00_gradients; GELU: 07_blocks)


def relu_forward(x):
    """``out = max(x, 0)``.  x: any shape  ->  out: the same shape."""
    ### BEGIN SOLUTION 00 §4
    out = np.maximum(x, 0)
    ### END SOLUTION
    return out, x > 0


def relu_backward(dout, cache):
    """``dx = dout * [x > 0]`` (0 at x = 0, as PyTorch).  dout: any shape -> dx: that shape."""
    ### BEGIN SOLUTION 00 §4
    return dout * cache
    ### END SOLUTION


def gelu_forward(x, approximate="none"):
    """GELU, ``x * Phi(x)``, as ``torch.nn.functional.gelu``.

    ``approximate="none"``: ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the normal distribution
    function. ``"tanh"``: ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``.
    x: any shape  ->  out: the same shape, and the cache ``(x, approximate, aux)``, ``aux``
    being ``Phi(x)`` or ``t = tanh(...)`` (:func:`gelu_backward` unpacks it).
    """
    ### BEGIN SOLUTION 07 §1
    c = x.dtype.type
    if approximate == "none":
        phi = 0.5 * (1 + erf(x / c(math.sqrt(2))))
        return x * phi, (x, approximate, phi)
    t = x * x  # the tanh's argument sqrt(2/pi) (x + 0.044715 x^3), in place: few temporaries
    t *= c(0.044715)
    t += 1
    t *= x
    t *= c(math.sqrt(2 / math.pi))
    np.tanh(t, out=t)
    out = t + 1  # x/2 (1 + t)
    out *= x
    out *= c(0.5)
    return out, (x, approximate, t)
    ### END SOLUTION


def gelu_backward(dout, cache):
    """Gradient of :func:`gelu_forward`.

    exact: ``Phi(x) + x phi(x)`` with ``phi`` the normal density; tanh:
    ``(1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)``.
    """
    x, approximate, aux = cache  # aux: Phi(x), or t = tanh(...)
    ### BEGIN SOLUTION 07 §1
    c = x.dtype.type
    if approximate == "none":
        local = aux + x * c(1 / math.sqrt(2 * math.pi)) * np.exp(-0.5 * x * x)
    else:  # x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) + (1 + t)/2, in place
        local = x * x
        local *= c(3 * 0.044715)
        local += 1
        local *= x
        local *= c(0.5 * math.sqrt(2 / math.pi))
        local *= 1 - aux * aux
        local += 0.5 * (1 + aux)
    local *= dout
    return local
    ### END SOLUTION


#: activation name -> (forward, backward, keyword arguments of the forward)
ACTIVATIONS = {"relu": (relu_forward, relu_backward, {}),
               "gelu": (gelu_forward, gelu_backward, {"approximate": "none"}),
               "gelu_tanh": (gelu_forward, gelu_backward, {"approximate": "tanh"})}


def activation_forward(x, activation):
    """The activation named ``activation``: "relu", "gelu" or "gelu_tanh" (see ``ACTIVATIONS``).

    x: any shape  ->  out: the same shape.
    """
    ### BEGIN SOLUTION 07 §1
    forward, _, kwargs = ACTIVATIONS[activation]
    out, cache = forward(x, **kwargs)
    ### END SOLUTION
    return out, (activation, cache)


def activation_backward(dout, cache):
    """Gradient of :func:`activation_forward`: dx, the shape of ``dout``."""
    activation, inner = cache
    ### BEGIN SOLUTION 07 §1
    return ACTIVATIONS[activation][1](dout, inner)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Softmax (01_attention; rows with nothing to attend to: 02_masking; backward:
# 05_attention_backward)


# Row sums are written ``np.einsum("...j->...", x)`` in the hot paths below: the same numbers
# as ``x.sum(axis=-1)``, computed three to five times faster when rows are short (a few dozen
# entries, as attention's are), where NumPy's ``sum`` spends its time per row, not per entry.


def softmax_forward(x, out=None):
    """Numerically stable softmax over the last axis.

    ``y = exp(x - max x) / sum exp(x - max x)``: subtracting the maximum changes nothing
    mathematically and keeps ``exp`` from overflowing. A row whose entries are all ``-inf``
    (a query whose keys are all masked) gets all zeros: it attends to nothing.

    x: (..., N); out: None, or an array of x's shape to write y into (x itself, when the caller
    no longer needs x: attention's scores)  ->  y: (..., N), rows summing to one (or all zeros).
    """
    ### BEGIN SOLUTION 01 §3, 02 §4
    m = x.max(axis=-1, keepdims=True)  # (..., 1)
    m[np.isneginf(m)] = 0  # a row of -inf only: exp(-inf - 0) = 0 instead of exp(nan) ...
    y = np.subtract(x, m, out=out)  # a new array, or out
    np.exp(y, out=y)  # in place: no second temporary
    total = np.einsum("...j->...", y)[..., None]  # the row sums (..., 1), see above
    total[total == 0] = 1  # ... and 0 / 1 = 0
    y /= total
    ### END SOLUTION
    return y, y


def softmax_backward(dout, cache, out=None):
    """Gradient of :func:`softmax_forward`, without the Jacobian.

    A row's Jacobian is ``diag(y) - y y^T``, so ``dx = y * (dout - sum(dout * y))``.
    dout: (..., N); out: None, or where to write dx (dout itself, when the caller no longer
    needs it)  ->  dx: (..., N).
    """
    y = cache
    ### BEGIN SOLUTION 05 §1
    # sum(dout * y) over each row: einsum forms no (..., N) temporary
    dx = np.subtract(dout, np.einsum("...j,...j->...", dout, y)[..., None], out=out)
    dx *= y
    return dx
    ### END SOLUTION


def log_softmax_forward(x):
    """``log softmax(x)`` over the last axis, as ``z - log sum exp z`` with ``z = x - max x``.

    x: (..., N), every row with a finite entry  ->  out: (..., N).
    """
    ### BEGIN SOLUTION 06 §2
    z = x - x.max(axis=-1, keepdims=True)
    out = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    ### END SOLUTION
    return out, out


def log_softmax_backward(dout, cache):
    """Gradient of :func:`log_softmax_forward`: ``dx = dout - softmax(x) * sum(dout)``."""
    out = cache
    ### BEGIN SOLUTION 06 §2
    return dout - np.exp(out) * dout.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Cross-entropy (06_layers_backward)


def cross_entropy_forward(logits, targets, ignore_index=-100, reduction="mean"):
    """Softmax cross-entropy over the last axis, as ``torch.nn.functional.cross_entropy``.

    ``loss_i = -log softmax(logits_i)[targets_i]``, summed or averaged over the entries whose
    target is not ``ignore_index`` (padding): the mean divides by their number, not by all
    entries.

    logits: (..., C); targets: integer class ids (...)  ->  loss: a float.
    """
    ### BEGIN SOLUTION 06 §2
    logp, c_logp = log_softmax_forward(logits)  # (..., C)
    keep = targets != ignore_index  # (...)
    safe = np.where(keep, targets, 0)  # any valid id where ignored: its term is dropped
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # (...)
    weight = 1 / keep.sum() if reduction == "mean" else 1.0
    loss = -float((picked * keep).sum() * weight)  # one number to the host, at the end
    ### END SOLUTION
    return loss, (c_logp, safe, keep, weight)


def cross_entropy_backward(dloss, cache):
    """Gradient of :func:`cross_entropy_forward`: ``(softmax(logits) - onehot(target)) * w``
    where ``w`` is ``1/count`` (mean) or 1 (sum), and 0 on ignored entries.

    dloss: a float (1.0 for the final loss)  ->  dlogits: (..., C).
    """
    c_logp, safe, keep, weight = cache
    ### BEGIN SOLUTION 06 §2
    w = (-dloss * weight * keep).astype(c_logp.dtype)  # (...): d loss / d logp at the target
    onehot = np.arange(c_logp.shape[-1]) == safe[..., None]  # (..., C)
    dlogp = np.where(onehot, w[..., None], 0)  # 0 off the target; c_logp is log softmax(logits)
    return log_softmax_backward(dlogp, c_logp)
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Layer normalisation (06_layers_backward)


def layer_norm_forward(x, gamma=None, beta=None, eps=1e-5):
    """Layer normalisation over the last axis, as ``torch.nn.LayerNorm``.

    ``xhat = (x - mean) / sqrt(var + eps)`` (the biased variance), ``out = xhat * gamma + beta``.
    x: (..., D); gamma, beta: (D,) or None  ->  out: (..., D).
    """
    ### BEGIN SOLUTION 06 §1
    d = x.shape[-1]
    xc = x - np.einsum("...j->...", x)[..., None] / d  # x - mean(x), (..., D)
    var = np.einsum("...j,...j->...", xc, xc)[..., None] / d  # mean(xc * xc), (..., 1)
    rstd = 1 / np.sqrt(var + eps)  # (..., 1)
    xhat = xc * rstd
    out = xhat * gamma if gamma is not None else xhat.copy()
    if beta is not None:
        out += beta
    ### END SOLUTION
    return out, (xhat, rstd, gamma, beta)


def layer_norm_backward(dout, cache):
    """Gradients of :func:`layer_norm_forward`.

    With ``g = dout * gamma``: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``;
    ``dgamma = sum(dout * xhat)``, ``dbeta = sum(dout)`` over the leading axes.
    dout: (..., D)  ->  dx: (..., D), grads: {"gamma": (D,), "beta": (D,)} (those present).
    """
    xhat, rstd, gamma, beta = cache
    ### BEGIN SOLUTION 06 §1
    d = xhat.shape[-1]
    grads = {}
    if gamma is not None:
        grads["gamma"] = (dout * xhat).reshape(-1, d).sum(axis=0)
    if beta is not None:
        grads["beta"] = dout.reshape(-1, d).sum(axis=0)
    g = dout * gamma if gamma is not None else dout
    mean_g = np.einsum("...j->...", g)[..., None] / d  # (..., 1)
    mean_gx = np.einsum("...j,...j->...", g, xhat)[..., None] / d  # mean(g * xhat), (..., 1)
    dx = g - mean_g
    dx -= xhat * mean_gx
    dx *= rstd
    ### END SOLUTION
    return dx, grads


# --------------------------------------------------------------------------------------------
# Embedding, positions and tied output (06_layers_backward: the embedding's
# gradient; 08_transformer: positions and weight tying)


def embedding_forward(ids, W):
    """Look up rows of the table: ``out[...] = W[ids[...]]``.

    ids: integer token ids, any shape S; W: (V, D)  ->  out: (*S, D).
    """
    ### BEGIN SOLUTION 06 §3
    out = W[ids]
    ### END SOLUTION
    return out, (ids, W.shape)


def embedding_backward(dout, cache):
    """Gradient of the table: every row adds up the gradients of all its occurrences.

    ``np.add.at`` adds once per occurrence; ``dW[ids] += dout`` would keep only one of the
    repeated ids. dout: (*S, D)  ->  grads: {"W": (V, D)} (the ids get no gradient).
    """
    ids, shape = cache
    ### BEGIN SOLUTION 06 §3
    dW = np.zeros(shape, dtype=dout.dtype)
    np.add.at(dW, ids.reshape(-1), dout.reshape(-1, shape[1]))
    ### END SOLUTION
    return {"W": dW}


def positional_encoding(max_len, d_model, base=10000.0):
    """The sinusoidal table of "Attention Is All You Need", float64.

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
    ->  PE: (max_len, d_model) (an odd width gets one more sine than cosine column).
    """
    ### BEGIN SOLUTION 08 §1
    pos = np.arange(max_len, dtype=np.float64)[:, None]  # (L, 1)
    inv_freq = base ** (-np.arange(0, d_model, 2) / d_model)  # (ceil(D/2),)
    angles = pos * inv_freq  # (L, ceil(D/2))
    pe = np.empty((max_len, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
    ### END SOLUTION
    return pe


def tied_output_forward(x, W_embed):
    """The output projection through the token embedding table (tied weights):
    ``logits = x @ W_embed.T``, one score per row of the table. (An untied model's output table
    of its own, the GPT's ``lm_head`` (V, E), goes through the same function.)

    x: (..., E); W_embed: (V, E), the embedding table itself  ->  logits: (..., V).
    """
    ### BEGIN SOLUTION 08 §4
    logits, cache = linear_forward(x, W_embed.T)  # W_embed.T: (E, V), a view
    ### END SOLUTION
    return logits, cache


def tied_output_backward(dout, cache):
    """Gradients of :func:`tied_output_forward`.

    dout: (..., V)  ->  dx: (..., E), grads: {"W": (V, E)}, the table's gradient from this use
    only (``dout^T x`` summed over the leading axes); the embedding lookup of the same table
    adds its own gradient to it.
    """
    ### BEGIN SOLUTION 08 §4
    dx, g = linear_backward(dout, cache)  # g["W"]: (E, V), the gradient of W_embed.T
    grads = {"W": g["W"].T}
    ### END SOLUTION
    return dx, grads


# --------------------------------------------------------------------------------------------
# Dropout (07_blocks)


def dropout_forward(x, p, rng, train=True):
    """Inverted dropout: in training, zero each entry with probability ``p`` and scale the
    others by ``1 / (1 - p)``, so that the expected output is ``x``; in evaluation, identity.

    x: any shape; p: the drop probability, 0 <= p <= 1; rng: a ``np.random.Generator``
    ->  out: the same shape, and the cache: ``(keep, scale)`` -- the (same shape) bool mask of
    the entries kept and the factor ``1 / (1 - p)`` (0 for p = 1) -- or None where dropout is
    the identity (evaluation, p = 0).
    """
    ### BEGIN SOLUTION 07 §4
    if not train or p == 0:
        return x, None
    keep = rng.random(x.shape) >= p
    scale = x.dtype.type(1 / (1 - p) if p < 1 else 0)  # p = 1: every entry dropped
    return x * keep * scale, (keep, scale)
    ### END SOLUTION


def dropout_backward(dout, cache):
    """Gradient of :func:`dropout_forward`: the same mask and scale (identity in evaluation)."""
    ### BEGIN SOLUTION 07 §4
    if cache is None:
        return dout
    keep, scale = cache
    return dout * keep * scale
    ### END SOLUTION


# --------------------------------------------------------------------------------------------
# Initialisation (07_blocks)


def init_uniform(fan_in, shape, rng):
    """Uniform in ``+-1/sqrt(fan_in)``, ``nn.Linear``'s default: the output of ``x @ W`` keeps
    roughly the variance of ``x`` (times 1/3) whatever the width. -> an array of ``shape``."""
    ### BEGIN SOLUTION 07 §5
    bound = 1 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape)
    ### END SOLUTION


def init_xavier(fan_in, fan_out, rng):
    """Xavier (Glorot) uniform, ``+-sqrt(6 / (fan_in + fan_out))``, the attention projections'
    default in PyTorch: variance ``2 / (fan_in + fan_out)``. -> (fan_in, fan_out)."""
    ### BEGIN SOLUTION 07 §5
    bound = math.sqrt(6 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=(fan_in, fan_out))
    ### END SOLUTION
