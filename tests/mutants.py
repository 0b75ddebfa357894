"""The mutation catalogue: realistic mistakes in the course's solutions, and the checks that
must catch them.

Each :class:`Mutant` is one small textual edit of one solution: of a core function's body
between its solution markers (``where`` = the function's name), or of a notebook exercise's
solution cell (``where`` = ``"NN_topic/cell-id"``). ``old`` must occur exactly once there. Every
check of ``checks`` must fail on the mutated solution in its public cases (what the student's
check cell runs) and in the grader's cases. ``tests/test_mutations.py`` applies them; the text
of each entry says what mistake it models. An entry's ``hint``, where given, is words that the
first check's public failure must say, its hint's or the loop rule's
(``tests/test_check_messages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_lab import syllabus


@dataclass(frozen=True)
class Mutant:
    where: str  # a core function, or "NN_topic/exercise-cell-id"
    models: str  # the mistake, in words
    old: str
    new: str
    checks: tuple[str, ...]
    hint: str = ""  # words of the hint the first check's public failure names, if any

    @property
    def is_exercise(self) -> bool:
        return "/" in self.where

    @property
    def notebook(self) -> str:
        """The notebook that teaches the mutated code (its first, for a core function)."""
        if self.is_exercise:
            return self.where.split("/")[0]
        return syllabus.where_taught(self.where)[1].split(" §")[0]


CATALOGUE: list[Mutant] = []


def mutant(where: str, models: str, old: str, new: str, *checks: str, hint: str = "") -> None:
    """Add a mutant: in ``where``, ``old`` becomes ``new``, a mistake that ``checks`` catch (the
    first naming it with ``hint``'s words, where given)."""
    CATALOGUE.append(Mutant(where, models, old, new, checks, hint))


# ============================================================================================
# 00_gradients


mutant("relu_forward", "the ReLU applied in place (np.maximum(x, 0, out=x)): the input changes",
       "out = np.maximum(x, 0)", "out = np.maximum(x, 0, out=x)", "check-relu")
mutant("relu_forward", "|x| for max(x, 0)", "out = np.maximum(x, 0)", "out = np.abs(x)",
       "check-relu", hint="with |x| for max(x, 0)")
mutant("relu_forward", "a leaky ReLU by mistake: negative inputs pass scaled by 0.01",
       "out = np.maximum(x, 0)", "out = np.maximum(x, 0.01 * x)", "check-relu")
mutant("relu_backward", "the ReLU applied to dout instead of the mask of x",
       "return dout * cache", "return np.maximum(dout, 0)", "check-relu")
mutant("relu_backward", "the gradient multiplied into dout in place (dout *= mask)",
       "return dout * cache", "dout *= cache\n    return dout", "check-relu")
mutant("relu_backward", "the mask itself returned, dout forgotten",
       "return dout * cache", "return cache * 1.0", "check-relu")

mutant("relu_backward", "the bool mask compared with 0 (cache >= 0: True everywhere)",
       "return dout * cache", "return dout * (cache >= 0)", "check-relu",
       hint="the cache is the mask x > 0 already")

mutant("linear_forward", "the weight transposed (x @ W.T, PyTorch's layout)",
       "out = x.reshape(-1, x.shape[-1]) @ W", "out = x.reshape(-1, x.shape[-1]) @ W.T",
       "check-linear-forward")
mutant("linear_forward", "float64 zeros for a missing bias (a float32 x comes back float64)",
       "    if b is not None:\n        out += b\n",
       "    out = out + (b if b is not None else np.zeros(W.shape[1]))\n", "check-linear-forward")
mutant("linear_forward", "the bias subtracted", "        out += b\n", "        out -= b\n",
       "check-linear-forward", hint="subtracting the bias b")
mutant("linear_forward", "the bias forgotten",
       "        out += b\n", "        pass\n", "check-linear-forward")
mutant("linear_forward", "the bias added only when it is None-checked the wrong way round",
       "if b is not None:\n        out += b", "if b is None:\n        out += 0",
       "check-linear-forward")
mutant("linear_forward", "the leading axes not restored (out stays (N, D_out))",
       "    out = out.reshape(*x.shape[:-1], W.shape[1])  # (..., D_out)\n", "",
       "check-linear-forward-batched")
mutant("linear_forward", "a Python loop over the batch (the text asks for one product)",
       "out = x.reshape(-1, x.shape[-1]) @ W",
       "out = np.stack([xb @ W for xb in x]) if x.ndim > 2 else x @ W",
       "check-linear-forward-batched", hint="runs a Python loop")
mutant("linear_forward", "the rows flattened in Fortran order, restored in C order",
       "out = x.reshape(-1, x.shape[-1]) @ W", "out = x.reshape(-1, x.shape[-1], order=\"F\") @ W",
       "check-linear-forward-batched", hint="flattening in Fortran order")
mutant("linear_forward", "x.T flattened (the rows in (t, b) order)",
       "out = x.reshape(-1, x.shape[-1]) @ W", "out = x.T.reshape(x.shape[-1], -1).T @ W",
       "check-linear-forward-batched", hint="flattening x.T")
mutant("linear_forward", "the leading axes flattened by x.shape[1] (counted from the left)",
       "out = x.reshape(-1, x.shape[-1]) @ W", "out = x.reshape(-1, x.shape[1]) @ W",
       "check-linear-forward-batched", hint="an axis counted from the left")
mutant("linear_backward", "dW with the transpose on the wrong side (dout^T x)",
       "grads = {\"W\": x.reshape(-1, x.shape[-1]).T @ dout2}",
       "grads = {\"W\": (x.reshape(-1, x.shape[-1]).T @ dout2).T}",
       "check-linear-backward", "check-linear-backward-batched")
mutant("linear_backward", "dx = dout W (W not transposed)",
       "dx = (dout2 @ W.T).reshape(x.shape)", "dx = (dout2 @ W).reshape(x.shape)",
       "check-linear-backward", "check-linear-backward-batched")
mutant("linear_backward", "the bias gradient averaged over the rows instead of summed",
       "grads[\"b\"] = dout2.sum(axis=0)", "grads[\"b\"] = dout2.mean(axis=0)",
       "check-linear-backward", "check-linear-backward-batched")
mutant("linear_backward", "the bias gradient with keepdims=True, shape (1, D_out)",
       "grads[\"b\"] = dout2.sum(axis=0)", "grads[\"b\"] = dout2.sum(axis=0, keepdims=True)",
       "check-linear-backward", "check-linear-backward-batched")
mutant("linear_backward", "the bias gradient summed over the positions, not the batch",
       'grads["b"] = dout2.sum(axis=0)', 'grads["b"] = dout.sum(axis=-2)',
       "check-linear-backward-batched",
       hint="are still there: a weight's or a bias's gradient sums over them")
mutant("linear_backward", "dW summed by a Python loop over the batch",
       "grads = {\"W\": x.reshape(-1, x.shape[-1]).T @ dout2}",
       "grads = {\"W\": sum(np.swapaxes(xb, -1, -2) @ db for xb, db in zip(x, dout)) "
       "if x.ndim == 3 else x.reshape(-1, x.shape[-1]).T @ dout2}",
       "check-linear-backward-batched", hint="runs a Python loop")
mutant("linear_backward", "dW averaged over the rows",
       "grads = {\"W\": x.reshape(-1, x.shape[-1]).T @ dout2}",
       "grads = {\"W\": x.reshape(-1, x.shape[-1]).T @ dout2 / len(dout2)}",
       "check-linear-backward", "check-linear-backward-batched")
mutant("linear_backward", "dx left flat (N, D_in), not reshaped to x's shape",
       "dx = (dout2 @ W.T).reshape(x.shape)", "dx = dout2 @ W.T",
       "check-linear-backward-batched")
mutant("linear_backward", "the bias gradient summed over the first axis only (dout, not the "
       "flattened rows)",
       "grads[\"b\"] = dout2.sum(axis=0)", "grads[\"b\"] = dout.sum(axis=0)",
       "check-linear-backward-batched")

MSE = "00_gradients/exercise-mse"
mutant(MSE, "the mean over the rows only (sum / P.shape[0])",
       "    loss = float(np.mean(diff ** 2))\n    dP = 2 * diff / diff.size\n",
       "    loss = float(np.sum(diff ** 2) / diff.shape[0])\n    dP = 2 * diff / diff.shape[0]\n",
       "check-mse", hint="averaging over the rows only")
mutant(MSE, "without the factor 2 of the square's derivative",
       "dP = 2 * diff / diff.size", "dP = diff / diff.size", "check-mse")
mutant(MSE, "dividing by the number of rows instead of the number of entries",
       "dP = 2 * diff / diff.size", "dP = 2 * diff / len(diff)", "check-mse")
mutant(MSE, "the loss left a NumPy number instead of a Python float",
       "loss = float(np.mean(diff ** 2))", "loss = np.mean(diff ** 2)", "check-mse")
mutant(MSE, "P - Y computed in place: P changes",
       "diff = P - Y", "diff = P\n    diff -= Y", "check-mse")
mutant(MSE, "the sum of the squares instead of their mean",
       "loss = float(np.mean(diff ** 2))", "loss = float(np.sum(diff ** 2))", "check-mse")


# ============================================================================================
# 01_attention

mutant("softmax_forward", "each row divided by the sum of the whole array",
       "    total = np.einsum(\"...j->...\", y)[..., None]  # the row sums (..., 1), see above\n",
       "    total = np.array(y.sum())\n", "check-softmax-forward",
       hint="the sum of the whole array (e.sum() without an axis)")
mutant("softmax_forward", "out returned without y written into it",
       "    y = np.subtract(x, m, out=out)  # a new array, or out\n",
       "    y = x - m\n    if out is not None:\n        return out, out\n", "check-softmax-forward")
mutant("softmax_forward", "the maximum of the whole array instead of each row's",
       "m = x.max(axis=-1, keepdims=True)", "m = x.max(keepdims=True)",
       "check-softmax-forward", "check-softmax-empty-rows")
mutant("softmax_forward", "the maximum over the first axis instead of the last",
       "m = x.max(axis=-1, keepdims=True)", "m = x.max(axis=0, keepdims=True)",
       "check-softmax-forward", hint="subtracting the maximum over the first axis")
mutant("softmax_forward", "the row sums without keepdims (they broadcast along the rows)",
       "total = np.einsum(\"...j->...\", y)[..., None]", "total = np.einsum(\"...j->...\", y)",
       "check-softmax-forward")
mutant("softmax_forward", "the sums over the first axis instead of along each row",
       "total = np.einsum(\"...j->...\", y)[..., None]", "total = y.sum(axis=0, keepdims=True)",
       "check-softmax-forward", hint="summing over the first axis")
mutant("softmax_forward", "x - m written into x itself: the input changes",
       "y = np.subtract(x, m, out=out)", "y = np.subtract(x, m, out=x)",
       "check-softmax-forward")
mutant("softmax_forward", "without subtracting the maximum (exp overflows)",
       "y = np.subtract(x, m, out=out)", "y = np.add(x, 0, out=out)", "check-softmax-forward")

mutant("attention_forward", "a softmax written in, without subtracting the maximum",
       "    weights, c_softmax = softmax_forward(scores, out=scores)  # (..., T, S), in place\n",
       "    e = np.exp(scores)\n    weights = c_softmax = e / e.sum(axis=-1, keepdims=True)\n",
       "check-attention-forward", hint="does not subtract the row's maximum")
mutant("attention_forward", "a Python loop over the queries' rows of scores",
       "    weights, c_softmax = softmax_forward(scores, out=scores)  # (..., T, S), in place\n",
       "    weights = np.stack([softmax_forward(s)[0] for s in scores])\n    c_softmax = weights\n",
       "check-attention-forward", hint="runs a Python loop")
mutant("attention_forward", "the scores cached where the weights belong",
       "    weights, c_softmax = softmax_forward(scores, out=scores)  # (..., T, S), in place\n",
       "    c_softmax = scores.copy()\n    weights, _ = softmax_forward(scores)\n",
       "check-attention-forward", hint="with the scores in the cache")
mutant("attention_forward", "without the scale 1/sqrt(d_k)",
       "scores = (q * scale) @ np.swapaxes(k, -1, -2)", "scores = q @ np.swapaxes(k, -1, -2)",
       "check-attention-forward")
mutant("attention_forward", "the scale from d_v, the values' width (v.shape[-1])",
       "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / math.sqrt(v.shape[-1])",
       "check-attention-forward", hint="dividing by sqrt(d_v)")
mutant("attention_forward", "the scale from S, the keys' count (T = S in the first case)",
       "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / math.sqrt(k.shape[-2])",
       "check-attention-forward", hint="the number of queries or keys")
mutant("attention_forward", "the scaled q in the cache (q = q * scale): the backward scales twice",
       "scores = (q * scale) @ np.swapaxes(k, -1, -2)",
       "q = q * scale\n    scores = q @ np.swapaxes(k, -1, -2)", "check-attention-forward",
       hint="caching the scaled q")
mutant("attention_forward", "dividing by d_k instead of sqrt(d_k)",
       "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / q.shape[-1]",
       "check-attention-forward")
mutant("attention_forward", "the scale argument ignored (always 1/sqrt(d_k))",
       "if scale is None:\n        scale", "if True:\n        scale", "check-attention-forward")
mutant("attention_forward", "1/np.sqrt(d_k), a NumPy float64 that promotes float32 inputs",
       "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / np.sqrt(q.shape[-1])",
       "check-attention-forward")
mutant("attention_forward", "q scaled in place (q *= scale): the input changes",
       "scores = (q * scale) @ np.swapaxes(k, -1, -2)",
       "q *= scale\n    scores = q @ np.swapaxes(k, -1, -2)", "check-attention-forward")
mutant("attention_forward", "d_k read as q.shape[1] (on a batch that is T)",
       "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / math.sqrt(q.shape[1])",
       "check-attention-batched")
mutant("attention_forward", "k.T for the keys' transpose (on a batch it reverses every axis)",
       "scores = (q * scale) @ np.swapaxes(k, -1, -2)", "scores = (q * scale) @ k.T",
       "check-attention-batched", hint="it reverses every axis")
mutant("attention_forward", "a Python loop over the batch (the text asks for none)",
       "scores = (q * scale) @ np.swapaxes(k, -1, -2)",
       "scores = np.stack([(qb * scale) @ np.swapaxes(kb, -1, -2) for qb, kb in zip(q, k)])"
       " if q.ndim > 2 else (q * scale) @ np.swapaxes(k, -1, -2)",
       "check-attention-batched", hint="runs a Python loop")

LSE = "01_attention/exercise-logsumexp"
mutant(LSE, "no maximum subtracted (exp overflows far from 0)",
       "    c = np.max(x, axis=axis, keepdims=True)\n",
       "    c = np.zeros_like(np.max(x, axis=axis, keepdims=True))\n", "check-logsumexp",
       hint="without subtracting the maximum first")
mutant(LSE, "the -inf entries left out of the maximum (a slice far below 0 beside -inf)",
       "c = np.max(x, axis=axis, keepdims=True)",
       "c = np.max(np.where(np.isneginf(x), 0, x), axis=axis, keepdims=True)", "check-logsumexp")
mutant(LSE, "float64 forced: a float32 input comes back float64",
       "c = np.max(x, axis=axis, keepdims=True)",
       "x = np.asarray(x, dtype=float)\n    c = np.max(x, axis=axis, keepdims=True)",
       "check-logsumexp")
mutant(LSE, "the maximum of the whole array instead of each slice's",
       "c = np.max(x, axis=axis, keepdims=True)", "c = np.max(x)", "check-logsumexp")
mutant(LSE, "the reduced axis kept in the result",
       "    out = np.squeeze(out, axis=axis)\n", "", "check-logsumexp")
mutant(LSE, "every axis of length 1 squeezed, not the reduced one only",
       "out = np.squeeze(out, axis=axis)", "out = np.squeeze(out)", "check-logsumexp")
mutant(LSE, "the maximum not added back after the log",
       "out = c + np.log(", "out = np.log(", "check-logsumexp")
mutant(LSE, "the maximum along the last axis whatever `axis` is",
       "c = np.max(x, axis=axis, keepdims=True)", "c = np.max(x, axis=-1, keepdims=True)",
       "check-logsumexp")

COS = "01_attention/exercise-cosine-attention"
mutant(COS, "tau left out", "scores = Qn @ np.swapaxes(Kn, -1, -2) / tau",
       "scores = Qn @ np.swapaxes(Kn, -1, -2)", "check-cosine-attention",
       hint="without the temperature tau")
mutant(COS, "only the queries normalised",
       "Kn = K / np.linalg.norm(K, axis=-1, keepdims=True)", "Kn = K", "check-cosine-attention")
mutant(COS, "the queries normalised along the sequence axis",
       "Qn = Q / np.linalg.norm(Q, axis=-1, keepdims=True)",
       "Qn = Q / np.linalg.norm(Q, axis=-2, keepdims=True)", "check-cosine-attention")
mutant(COS, "the cosines multiplied by tau instead of divided",
       "scores = Qn @ np.swapaxes(Kn, -1, -2) / tau", "scores = Qn @ np.swapaxes(Kn, -1, -2) * tau",
       "check-cosine-attention")
mutant(COS, "the softmax over the queries",
       "weights = softmax(scores, axis=-1)", "weights = softmax(scores, axis=-2)",
       "check-cosine-attention")
mutant(COS, "Kn.T for the keys' transpose on a batch",
       "np.swapaxes(Kn, -1, -2)", "Kn.T", "check-cosine-attention")

ADD = "01_attention/exercise-additive-attention"
mutant(ADD, "the tanh after the product with w",
       "    hidden = np.tanh((Q @ W1)[:, None, :] + (K @ W2)[None, :, :])  # (T, S, h)\n"
       "    scores = hidden @ w                                             # (T, S)\n",
       "    hidden = (Q @ W1)[:, None, :] + (K @ W2)[None, :, :]\n"
       "    scores = np.tanh(hidden @ w)\n",
       "check-additive-attention", hint="with the tanh taken after the product with w")
mutant(ADD, "the scores divided by sqrt(h)",
       "    scores = hidden @ w                                             # (T, S)\n",
       "    scores = hidden @ w / np.sqrt(w.shape[0])\n", "check-additive-attention",
       hint="dividing the scores by sqrt(h)")
mutant(ADD, "a double Python loop over the queries and the keys (the text asks for none)",
       "hidden = np.tanh((Q @ W1)[:, None, :] + (K @ W2)[None, :, :])  # (T, S, h)\n"
       "    scores = hidden @ w                                             # (T, S)",
       "scores = np.zeros((Q.shape[0], K.shape[0]))\n"
       "    for i in range(Q.shape[0]):\n"
       "        for j in range(K.shape[0]):\n"
       "            scores[i, j] = w @ np.tanh(Q[i] @ W1 + K[j] @ W2)",
       "check-additive-attention")
mutant(ADD, "a Python loop over the queries only",
       "hidden = np.tanh((Q @ W1)[:, None, :] + (K @ W2)[None, :, :])  # (T, S, h)\n"
       "    scores = hidden @ w                                             # (T, S)",
       "scores = np.stack([np.tanh(q @ W1 + K @ W2) @ w for q in Q])",
       "check-additive-attention")
mutant(ADD, "without the tanh",
       "hidden = np.tanh((Q @ W1)[:, None, :] + (K @ W2)[None, :, :])",
       "hidden = (Q @ W1)[:, None, :] + (K @ W2)[None, :, :]", "check-additive-attention")
mutant(ADD, "W1 and W2 swapped",
       "np.tanh((Q @ W1)[:, None, :] + (K @ W2)[None, :, :])",
       "np.tanh((Q @ W2)[:, None, :] + (K @ W1)[None, :, :])", "check-additive-attention")
mutant(ADD, "the softmax over the queries",
       "weights = softmax(scores, axis=-1)", "weights = softmax(scores, axis=0)",
       "check-additive-attention")


# ============================================================================================
# 02_masking

mutant("causal_mask", "the triangle aligned at the bottom right (j > i + S - T)",
       "return np.arange(S)[None, :] > np.arange(T)[:, None]",
       "return np.arange(S)[None, :] > np.arange(T)[:, None] + S - T", "check-causal-mask",
       hint="aligned at the bottom right")
mutant("causal_mask", "the diagonal blocked too (j >= i)",
       "np.arange(S)[None, :] > np.arange(T)[:, None]",
       "np.arange(S)[None, :] >= np.arange(T)[:, None]", "check-causal-mask")
mutant("causal_mask", "the past blocked instead of the future (the transposed triangle)",
       "np.arange(S)[None, :] > np.arange(T)[:, None]",
       "np.arange(S)[None, :] < np.arange(T)[:, None]", "check-causal-mask")
mutant("causal_mask", "S ignored (a square (T, T) mask)",
       "S = T if S is None else S", "S = T", "check-causal-mask")
mutant("causal_mask", "True = allowed (the convention inverted)",
       "np.arange(S)[None, :] > np.arange(T)[:, None]",
       "np.arange(S)[None, :] <= np.arange(T)[:, None]", "check-causal-mask")
mutant("causal_mask", "a Python loop over the queries (the text asks for none)",
       "    return np.arange(S)[None, :] > np.arange(T)[:, None]\n",
       "    mask = np.zeros((T, S), dtype=bool)\n    for i in range(T):\n"
       "        mask[i, i + 1:] = True\n    return mask\n", "check-causal-mask",
       hint="runs a Python loop")

mutant("padding_mask", "> instead of >= (position lengths[b] is already padding)",
       "np.arange(S)[None, :] >= np.asarray(lengths)[:, None]",
       "np.arange(S)[None, :] > np.asarray(lengths)[:, None]", "check-padding-mask")
mutant("padding_mask", "an (S, B) mask, one column per sequence",
       "np.arange(S)[None, :] >= np.asarray(lengths)[:, None]",
       "np.arange(S)[:, None] >= np.asarray(lengths)[None, :]", "check-padding-mask")
mutant("padding_mask", "lengths indexed as an array without np.asarray (a list fails)",
       "np.asarray(lengths)[:, None]", "lengths[:, None]", "check-padding-mask")
mutant("padding_mask", "True = a real token (the convention inverted)",
       "np.arange(S)[None, :] >= np.asarray(lengths)[:, None]",
       "np.arange(S)[None, :] < np.asarray(lengths)[:, None]", "check-padding-mask")

mutant("padding_mask", "a Python loop over the sequences (the text asks for none)",
       "return np.arange(S)[None, :] >= np.asarray(lengths)[:, None]",
       "return np.array([np.arange(S) >= n for n in lengths]).reshape(-1, S)",
       "check-padding-mask", hint="runs a Python loop")

mutant("softmax_forward", "no guard for a row of -inf only (its maximum is -inf: NaN)",
       "    m[np.isneginf(m)] = 0  # a row of -inf only: exp(-inf - 0) = 0 instead of exp(nan) "
       "...\n", "", "check-softmax-empty-rows", "check-attention-empty-rows")
mutant("softmax_forward", "no guard for a zero row sum (0 / 0)",
       "    total[total == 0] = 1  # ... and 0 / 1 = 0\n", "", "check-softmax-empty-rows")
mutant("softmax_forward", "a row of -inf made uniform (its maximum replaced by -1e9's row)",
       "m[np.isneginf(m)] = 0", "x = np.where(np.isneginf(x), -1e9, x)\n"
       "    m = x.max(axis=-1, keepdims=True)", "check-softmax-empty-rows")

mutant("attention_forward", "blocked weights zeroed after the softmax and the rows renormalised "
       "(0 / 0 in a fully blocked row)", "    out = weights @ v  # (..., T, d_v)\n",
       "    if mask is not None and mask.dtype == bool:\n"
       "        weights = np.where(mask, 0.0, weights)\n"
       "        weights = weights / weights.sum(-1, keepdims=True)\n"
       "    out = weights @ v  # (..., T, d_v)\n", "check-attention-empty-rows",
       hint="a renormalisation after it")
mutant("attention_forward", "the float mask added before the scale",
       "    elif mask is not None:\n        scores += mask  # a float mask is added\n",
       "    elif mask is not None:\n        scores = (q @ np.swapaxes(k, -1, -2) + mask) * scale\n",
       "check-attention-mask", hint="adding the float mask before the scale")
mutant("attention_forward", "the boolean mask added to the scores (True counts as 1)",
       "np.copyto(scores, -np.inf, where=mask)", "scores += mask", "check-attention-mask")
mutant("attention_forward", "the mask read with True = allowed",
       "np.copyto(scores, -np.inf, where=mask)", "np.copyto(scores, -np.inf, where=~mask)",
       "check-attention-mask", hint="reading True as allowed")
mutant("attention_forward", "scores[mask] = -inf: a broadcast mask cannot index the scores",
       "np.copyto(scores, -np.inf, where=mask)", "scores[mask] = -np.inf", "check-attention-mask",
       hint="cannot index the scores")
mutant("attention_forward", "the cache holds the weights before the mask (masked on a copy)",
       "    weights, c_softmax = softmax_forward(scores, out=scores)  # (..., T, S), in place\n",
       "    weights, _ = softmax_forward(scores, out=scores)\n"
       "    c_softmax = softmax_forward((q * scale) @ np.swapaxes(k, -1, -2))[1]\n",
       "check-attention-mask", hint="the weights before the mask in the cache")
mutant("attention_forward", "blocked scores set to -1e9 instead of -inf",
       "np.copyto(scores, -np.inf, where=mask)", "np.copyto(scores, -1e9, where=mask)",
       "check-attention-empty-rows", hint="replacing its scores by a large negative number")
mutant("attention_forward", "-1e9 added at the blocked scores instead of -inf set",
       "np.copyto(scores, -np.inf, where=mask)", "scores -= 1e9 * mask",
       "check-attention-empty-rows", hint="adding a large negative number")
mutant("attention_forward", "a float mask ignored",
       "        scores += mask  # a float mask is added\n", "        pass\n",
       "check-attention-mask")
mutant("attention_forward", "a float mask read as a boolean one (nonzero = blocked)",
       "scores += mask  # a float mask is added",
       "np.copyto(scores, -np.inf, where=mask != 0)", "check-attention-mask")
mutant("attention_forward", "the mask ignored altogether",
       "if mask is not None and mask.dtype == bool:", "if False:", "check-attention-mask")

SW = "02_masking/exercise-sliding-window"
mutant(SW, "window - 1 positions seen (the window's first key blocked)", "(j <= i - window)",
       "(j <= i - window + 1)", "check-sliding-window", hint="seeing window - 1 positions")
mutant(SW, "a Python loop over the queries (the text asks for none)",
       "    mask = (j > i) | (j <= i - window)\n",
       "    mask = np.zeros((T, T), bool)\n    for q in range(T):\n"
       "        mask[q] = (j[0] > q) | (j[0] <= q - window)\n", "check-sliding-window",
       hint="runs a Python loop")
mutant(SW, "window + 1 positions seen (j < i - window blocked)",
       "(j <= i - window)", "(j < i - window)", "check-sliding-window")
mutant(SW, "without the causal part", "mask = (j > i) | (j <= i - window)",
       "mask = j <= i - window", "check-sliding-window")
mutant(SW, "True = allowed", "mask = (j > i) | (j <= i - window)",
       "mask = (j <= i) & (j > i - window)", "check-sliding-window")
mutant(SW, "an int mask (.astype(int)) where a bool one belongs",
       "    mask = (j > i) | (j <= i - window)\n",
       "    mask = ((j > i) | (j <= i - window)).astype(int)\n", "check-sliding-window",
       hint="a boolean mask is expected")
PL = "02_masking/exercise-prefix-lm"
mutant(PL, "the prefix one position too short (j > P)", "(j >= prefix_len)", "(j > prefix_len)",
       "check-prefix-lm")
mutant(PL, "| instead of &", "(j > i) & (j >= prefix_len)", "(j > i) | (j >= prefix_len)",
       "check-prefix-lm")
mutant(PL, "the prefix rows opened instead of the prefix columns",
       "(j > i) & (j >= prefix_len)", "(j > i) & (i >= prefix_len)", "check-prefix-lm")
CM = "02_masking/exercise-cross-mask"
mutant(CM, "> where >= belongs: the first padding position left open",
       "    query_pad = np.arange(T)[None, :] >= np.asarray(query_lengths)[:, None]   # (B, T)\n"
       "    key_pad = np.arange(S)[None, :] >= np.asarray(key_lengths)[:, None]       # (B, S)\n",
       "    query_pad = np.arange(T)[None, :] > np.asarray(query_lengths)[:, None]\n"
       "    key_pad = np.arange(S)[None, :] > np.asarray(key_lengths)[:, None]\n",
       "check-cross-mask", hint="with > where >= belongs")
mutant(CM, "only the padded keys blocked",
       "mask = query_pad[:, :, None] | key_pad[:, None, :]",
       "mask = np.broadcast_to(key_pad[:, None, :], (len(key_pad), T, S))", "check-cross-mask")
mutant(CM, "only the padded queries blocked",
       "mask = query_pad[:, :, None] | key_pad[:, None, :]",
       "mask = np.broadcast_to(query_pad[:, :, None], (len(query_pad), T, S))",
       "check-cross-mask")
mutant(CM, "& instead of |", "query_pad[:, :, None] | key_pad[:, None, :]",
       "query_pad[:, :, None] & key_pad[:, None, :]", "check-cross-mask")
mutant(CM, "the query and key lengths swapped",
       "np.asarray(query_lengths)[:, None]   # (B, T)",
       "np.asarray(key_lengths)[:, None]   # (B, T)",
       "check-cross-mask")


# ============================================================================================
# 03_minibatching (linear_forward/backward and attention_forward on batches: above)

RMS = "03_minibatching/exercise-rms-norm"
mutant(RMS, "the mean square without keepdims",
       "ms = np.mean(x * x, axis=-1, keepdims=True)", "ms = np.mean(x * x, axis=-1)",
       "check-rms-norm")
mutant(RMS, "eps added outside the square root",
       "y = x / np.sqrt(ms + eps) * gamma", "y = x / (np.sqrt(ms) + eps) * gamma",
       "check-rms-norm")
mutant(RMS, "the mean over the first axis", "np.mean(x * x, axis=-1, keepdims=True)",
       "np.mean(x * x, axis=0, keepdims=True)", "check-rms-norm")
mutant(RMS, "the gain gamma left out", "y = x / np.sqrt(ms + eps) * gamma",
       "y = x / np.sqrt(ms + eps)", "check-rms-norm", hint="without the gain gamma")
mutant(RMS, "the mean subtracted first (a layer norm)", "y = x / np.sqrt(ms + eps) * gamma",
       "y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * gamma",
       "check-rms-norm", hint="that is a layer norm")
mutant(RMS, "the variance for the mean square", "ms = np.mean(x * x, axis=-1, keepdims=True)",
       "ms = x.var(axis=-1, keepdims=True)", "check-rms-norm",
       hint="dividing by the standard deviation")
mutant(RMS, "eps ignored (the default 1e-5 written in)",
       "np.sqrt(ms + eps)", "np.sqrt(ms + 1e-5)", "check-rms-norm")
mutant(RMS, "the mean of x, squared, instead of the mean of x squared",
       "ms = np.mean(x * x, axis=-1, keepdims=True)",
       "ms = np.mean(x, axis=-1, keepdims=True) ** 2", "check-rms-norm")
LAST = "03_minibatching/exercise-last-token"
mutant(LAST, "the length itself as the index (one past the last token)",
       "np.asarray(lengths) - 1]", "np.asarray(lengths)]", "check-last-token",
       hint="one past its end")
mutant(LAST, "a Python loop over the batch (the text asks for none)",
       "last = H[np.arange(H.shape[0]), np.asarray(lengths) - 1]",
       "last = np.stack([H[b, n - 1] for b, n in enumerate(lengths)])", "check-last-token",
       hint="runs a Python loop")
mutant(LAST, "row lengths[b] instead of lengths[b] - 1",
       "np.asarray(lengths) - 1]", "np.minimum(np.asarray(lengths), H.shape[1] - 1)]",
       "check-last-token")
mutant(LAST, "the last position of every sequence, padding included",
       "last = H[np.arange(H.shape[0]), np.asarray(lengths) - 1]", "last = H[:, -1]",
       "check-last-token")
mutant(LAST, "a slice instead of paired indices (a (B, B, D) result)",
       "H[np.arange(H.shape[0]), np.asarray(lengths) - 1]", "H[:, np.asarray(lengths) - 1]",
       "check-last-token")
MM = "03_minibatching/exercise-masked-mean"
mutant(MM, "<= where < belongs: the first padding position averaged in",
       "    valid = ~padding_mask(np.asarray(lengths), H.shape[1])      # (B, T), True = real "
       "token\n", "    valid = np.arange(H.shape[1])[None, :] <= np.asarray(lengths)[:, None]\n",
       "check-masked-mean", hint="with <= where < belongs")
mutant(MM, "divided by T instead of each sequence's length",
       "mean = total / np.asarray(lengths)[:, None]", "mean = total / H.shape[1]",
       "check-masked-mean")
mutant(MM, "the padding averaged in",
       "valid = ~padding_mask(np.asarray(lengths), H.shape[1])",
       "valid = np.ones(H.shape[:2], dtype=bool)", "check-masked-mean")
mutant(MM, "the mask multiplied into H in place: the input changes",
       "total = (H * valid[:, :, None]).sum(axis=1)",
       "H *= valid[:, :, None]\n    total = H.sum(axis=1)", "check-masked-mean")
mutant(MM, "the mask itself inverted (the padding kept, the tokens dropped)",
       "valid = ~padding_mask(", "valid = padding_mask(", "check-masked-mean")


# ============================================================================================
# 04_multihead_attention

mutant("split_heads", "the heads copied (np.ascontiguousarray): the text asks for no copy "
       "that is not needed", "return x.transpose(0, 2, 1, 3)  # (B, H, T, Dh)",
       "return np.ascontiguousarray(x.transpose(0, 2, 1, 3))", "check-split-heads",
       hint="copying the heads")
mutant("split_heads", "a reshape straight to (B, H, T, d_h), no swap",
       "x = x.reshape(B, T, num_heads, E // num_heads)  # (B, T, H, Dh)\n"
       "    return x.transpose(0, 2, 1, 3)  # (B, H, T, Dh)",
       "return x.reshape(B, num_heads, T, E // num_heads)", "check-split-heads")
mutant("split_heads", "the features cut as (d_h, H): heads interleaved",
       "x = x.reshape(B, T, num_heads, E // num_heads)  # (B, T, H, Dh)\n"
       "    return x.transpose(0, 2, 1, 3)  # (B, H, T, Dh)",
       "x = x.reshape(B, T, E // num_heads, num_heads)\n"
       "    return x.transpose(0, 3, 1, 2)", "check-split-heads")
mutant("split_heads", "the head width E / num_heads, a float (reshape refuses it)",
       "E // num_heads)  # (B, T, H, Dh)", "E / num_heads)  # (B, T, H, Dh)", "check-split-heads")
mutant("split_heads", "a Python loop over the heads (the text asks for none)",
       "x = x.reshape(B, T, num_heads, E // num_heads)  # (B, T, H, Dh)\n"
       "    return x.transpose(0, 2, 1, 3)  # (B, H, T, Dh)",
       "d = E // num_heads\n"
       "    return np.stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)",
       "check-split-heads", hint="copying the heads")  # a copy, named before the loop
mutant("merge_heads", "a reshape to (B, T, E) without swapping back",
       "return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)", "return x.reshape(B, T, H * Dh)",
       "check-merge-heads")
mutant("merge_heads", "the features ordered (d_h, H)",
       "return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)",
       "return x.transpose(0, 2, 3, 1).reshape(B, T, H * Dh)", "check-merge-heads")

mutant("merge_heads", "a Python loop over the heads (the text asks for none)",
       "return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)",
       "return np.concatenate([x[:, i] for i in range(H)], axis=-1)", "check-merge-heads",
       hint="runs a Python loop")

mutant("multi_head_attention_forward", "attention_forward's cache not kept (c_att = None): "
       "the backward pass of notebook 05 has nothing to read",
       "split_heads(v, num_heads), mask)  # (B, H, T, Dh)",
       "split_heads(v, num_heads), mask)  # (B, H, T, Dh)\n    c_att = None",
       "check-mha-forward", hint="keep the given return line")
mutant("multi_head_attention_forward", "the key and value projections' caches swapped",
       """    k, c_k = linear_forward(key, params["W_k"], params.get("b_k"))  # (B, S, E)
    v, c_v = linear_forward(value, params["W_v"], params.get("b_v"))  # (B, S, E)""",
       """    k, c_v = linear_forward(key, params["W_k"], params.get("b_k"))  # (B, S, E)
    v, c_k = linear_forward(value, params["W_v"], params.get("b_v"))  # (B, S, E)""",
       "check-mha-forward")
mutant("multi_head_attention_forward", "a Python loop over the heads, its cache c_att lost",
       """    heads, c_att = attention_forward(split_heads(q, num_heads), split_heads(k, num_heads),
                                     split_heads(v, num_heads), mask)  # (B, H, T, Dh)""",
       """    qs, ks, vs = (split_heads(a, num_heads) for a in (q, k, v))
    masks = [None if mask is None else np.broadcast_to(mask, qs.shape[:-1] + ks.shape[-2:])[:, i]
             for i in range(num_heads)]
    heads = np.stack([attention_forward(qs[:, i], ks[:, i], vs[:, i], masks[i])[0]
                      for i in range(num_heads)], axis=1)
    c_att = None""", "check-mha-forward", hint="c_att the cache of your one attention_forward")
mutant("multi_head_attention_forward", "the mask not passed on to attention",
       "split_heads(v, num_heads), mask)", "split_heads(v, num_heads))", "check-mha-forward")
mutant("multi_head_attention_forward", "the output bias left out",
       "params[\"W_o\"], params.get(\"b_o\"))", "params[\"W_o\"])", "check-mha-forward")
mutant("multi_head_attention_forward", "the values projected with the key's bias (copy-paste)",
       "params[\"W_v\"], params.get(\"b_v\"))", "params[\"W_v\"], params.get(\"b_k\"))",
       "check-mha-forward")
mutant("multi_head_attention_forward", "the values projected from the key input",
       "linear_forward(value, params[\"W_v\"]", "linear_forward(key, params[\"W_v\"]",
       "check-mha-forward")
mutant("multi_head_attention_forward", "the scores scaled by 1/sqrt(E) instead of 1/sqrt(d_h)",
       "split_heads(v, num_heads), mask)",
       "split_heads(v, num_heads), mask, query.shape[-1] ** -0.5)", "check-mha-forward")
mutant("multi_head_attention_forward", "without the output projection",
       "out, c_o = linear_forward(merge_heads(heads), params[\"W_o\"], params.get(\"b_o\"))",
       "out, c_o = merge_heads(heads), (None, None, None)", "check-mha-forward")

mutant("merge_masks", "the padding mask inverted (~key_padding_mask)",
       "key_padding_mask = key_padding_mask[:, None, None, :]",
       "key_padding_mask = ~key_padding_mask[:, None, None, :]", "check-merge-masks",
       hint="with the padding mask inverted")
mutant("merge_masks", "the masks combined with & instead of |",
       "return attn_mask | key_padding_mask", "return attn_mask & key_padding_mask",
       "check-merge-masks")
mutant("merge_masks", "the padded queries blocked instead of the padded keys",
       "key_padding_mask[:, None, None, :]", "key_padding_mask[:, None, :, None]",
       "check-merge-masks")
mutant("merge_masks", "the padding mask as (B, 1, S): b lined up with the heads axis",
       "key_padding_mask[:, None, None, :]", "key_padding_mask[:, None, :]",
       "check-merge-masks", hint="lines b up with the heads axis")
mutant("merge_masks", "the padding mask not reshaped to (B, 1, 1, S)",
       "key_padding_mask = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)",
       "pass", "check-merge-masks")
mutant("merge_masks", "the attention mask dropped when there is a padding mask",
       "return attn_mask | key_padding_mask  # (B, 1, T, S)", "return key_padding_mask",
       "check-merge-masks")

mutant("self_attention_forward", "the queries' heads cut by a loop over the heads",
       "    q = split_heads(q, num_heads)  # (B, H, T, Dh)\n",
       "    d = q.shape[-1] // num_heads\n"
       "    q = np.stack([q[..., i * d:(i + 1) * d] for i in range(num_heads)], 1)\n",
       "check-self-attention-forward", hint="runs a Python loop")
mutant("self_attention_forward", "W_qkv cut in the order q, v, k",
       "q, k, v = np.split(qkv, [E, E + kv], axis=-1)",
       "q, v, k = np.split(qkv, [E, E + kv], axis=-1)",
       "check-self-attention-forward", hint="with the keys and the values swapped")
mutant("multi_head_attention_forward", "the keys and the values swapped in the attention",
       "split_heads(k, num_heads),\n                                     split_heads(v, num_heads)",
       "split_heads(v, num_heads),\n                                     split_heads(k, num_heads)",
       "check-mha-forward", hint="with the keys and the values swapped")
mutant("multi_head_attention_forward", "W_q for the keys (a copy-paste)",
       'k, c_k = linear_forward(key, params["W_k"], params.get("b_k"))',
       'k, c_k = linear_forward(key, params["W_q"], params.get("b_q"))',
       "check-mha-forward", hint="with W_q for the keys too")
mutant("self_attention_forward", "the mask not passed on to attention",
       "heads, c_att = attention_forward(q, k, v, mask)",
       "heads, c_att = attention_forward(q, k, v)",
       "check-self-attention-forward")
mutant("self_attention_forward", "the packed bias ignored",
       "params[\"W_qkv\"], params.get(\"b_qkv\"))", "params[\"W_qkv\"])",
       "check-self-attention-forward")
mutant("self_attention_forward", "the output bias ignored",
       "params[\"W_o\"], params.get(\"b_o\"))", "params[\"W_o\"])",
       "check-self-attention-forward")
mutant("self_attention_forward", "q, k, v cut per head as [q_i | k_i | v_i]",
       "q, k, v = np.split(qkv, [E, E + kv], axis=-1)  # (B, T, E), (B, T, kv), (B, T, kv)\n"
       "    q = split_heads(q, num_heads)  # (B, H, T, Dh)\n"
       "    k, v = split_heads(k, Hkv), split_heads(v, Hkv)  # (B, Hkv, T, Dh)",
       "q, k, v = np.split(split_heads(qkv, num_heads), 3, axis=-1)",
       "check-self-attention-forward")
mutant("self_attention_forward", "the keys used as values (k, k)",
       "attention_forward(q, k, v, mask)", "attention_forward(q, k, k, mask)",
       "check-self-attention-forward")

GQA = "04_multihead_attention/exercise-gqa"
mutant(GQA, "the key/value heads tiled (head j serves j, j + g, ...) instead of repeated",
       "k = np.repeat(k, h // g, axis=1)", "k = np.tile(k, (1, h // g, 1, 1))", "check-gqa")
mutant(GQA, "the key/value heads gathered by a Python loop (the text asks for none)",
       "k = np.repeat(k, h // g, axis=1)",
       "k = np.stack([k[:, i // (h // g)] for i in range(h)], axis=1)", "check-gqa",
       hint="runs a Python loop")
mutant(GQA, "without the output projection", "out = merge_heads(ctx) @ W_o",
       "out = merge_heads(ctx)", "check-gqa")
mutant(GQA, "the key and the value heads both tiled",
       "k = np.repeat(k, h // g, axis=1)                              # (B, h, T, d_h)\n"
       "    v = np.repeat(v, h // g, axis=1)",
       "k = np.tile(k, (1, h // g, 1, 1))\n    v = np.tile(v, (1, h // g, 1, 1))", "check-gqa")
mutant(GQA, "the scores scaled by 1/sqrt(E)",
       "ctx, _ = scaled_dot_product_attention_forward(q, k, v)",
       "ctx, _ = scaled_dot_product_attention_forward(q, k, v, scale=E ** -0.5)", "check-gqa")
COST = "04_multihead_attention/exercise-gqa-cost"
mutant(COST, "the biases left out of the parameters",
       "params = 2 * (E * E + E) + 2 * (E * kv + kv)", "params = 2 * E * E + 2 * E * kv",
       "check-gqa-cost")
mutant(COST, "a multiply-add counted as one operation",
       "flops = 2 * (2 * T * E * E) + 2 * (2 * T * E * kv) + 4 * T * T * E",
       "flops = 2 * T * E * E + 2 * T * E * kv + 2 * T * T * E", "check-gqa-cost")
mutant(COST, "the scores counted for the g key/value heads only",
       "+ 4 * T * T * E", "+ 4 * T * T * kv", "check-gqa-cost")
mutant(COST, "E / num_heads, a float: the counts come back as floats, not the docstring's ints",
       "kv = num_kv_heads * (E // num_heads)", "kv = num_kv_heads * (E / num_heads)",
       "check-gqa-cost", hint="dividing with /")
mutant(COST, "K and V at full width (the multi-head formulas)",
       "kv = num_kv_heads * (E // num_heads)", "kv = E", "check-gqa-cost")


# ============================================================================================
# 05_attention_backward, 06_layers_backward

mutant("softmax_backward", "the cached y overwritten (y *= ...): the caller's weights change",
       "    dx *= y\n    return dx\n",
       "    y *= dx\n    return y\n", "check-softmax-backward", "check-attention-backward",
       hint="writes into an array that its forward pass cached")
mutant("softmax_backward", "sum(dout) where sum(dout * y) belongs",
       'np.einsum("...j,...j->...", dout, y)', 'np.einsum("...j->...", dout)',
       "check-softmax-backward", hint="with sum(dout) where sum(dout * y) belongs")
mutant("softmax_backward", "dout overwritten (out=dout) before the row sum reads it",
       'dx = np.subtract(dout, np.einsum("...j,...j->...", dout, y)[..., None], out=out)\n'
       "    dx *= y",
       "dx = np.multiply(dout, y, out=out)\n"
       '    dx -= y * np.einsum("...j,...j->...", dout, y)[..., None]', "check-softmax-backward",
       hint="dout overwritten before the row sum")
mutant("softmax_backward", "a Python loop over the rows (the text asks for none)",
       'dx = np.subtract(dout, np.einsum("...j,...j->...", dout, y)[..., None], out=out)\n'
       "    dx *= y",
       "y2, d2 = y.reshape(-1, y.shape[-1]), dout.reshape(-1, y.shape[-1])\n"
       "    dx = np.stack([r * (g - (g * r).sum()) for r, g in zip(y2, d2, strict=True)])"
       ".reshape(y.shape)", "check-softmax-backward", hint="runs a Python loop")
mutant("softmax_backward", "the row sum without keepdims",
       "np.einsum(\"...j,...j->...\", dout, y)[..., None]",
       "np.einsum(\"...j,...j->...\", dout, y)",
       "check-softmax-backward")
mutant("softmax_backward", "the factor y outside the bracket forgotten",
       "    dx *= y\n", "", "check-softmax-backward")
mutant("softmax_backward", "only the Jacobian's diagonal, dout * y * (1 - y)",
       "dx = np.subtract(dout, np.einsum(\"...j,...j->...\", dout, y)[..., None], out=out)\n"
       "    dx *= y",
       "dx = dout * y * (1 - y)", "check-softmax-backward")
mutant("softmax_backward", "dx written into dout: the input changes",
       "[..., None], out=out)", "[..., None], out=dout)", "check-softmax-backward")

mutant("attention_backward", "the softmax backward by a loop over the leading axes",
       "dscores = softmax_backward(dP, c_softmax, out=dP)",
       "dscores = np.stack([softmax_backward(a, b) for a, b in zip(dP.reshape(-1, *dP.shape[-2:]),"
       "\n        c_softmax.reshape(-1, *dP.shape[-2:]))]).reshape(dP.shape)",
       "check-attention-backward", hint="runs a Python loop")
mutant("attention_backward", "dweights added after the softmax backward",
       "    if dweights is not None:\n        dP += dweights\n"
       "    dscores = softmax_backward(dP, c_softmax, out=dP)  # (..., T, S), in place\n",
       "    dscores = softmax_backward(dP, c_softmax, out=dP)  # (..., T, S), in place\n"
       "    if dweights is not None:\n        dscores = dscores + dweights\n",
       "check-attention-backward", hint="adding dweights after the softmax backward")
mutant("attention_backward", "dq and dk swapped",
       "    dq = dscores @ k * scale  # (..., T, d_k)\n"
       "    dk = np.swapaxes(dscores, -1, -2) @ q * scale  # (..., S, d_k)\n",
       "    dk = dscores @ k * scale\n    dq = np.swapaxes(dscores, -1, -2) @ q * scale\n",
       "check-attention-backward", hint="with dq and dk swapped")
mutant("attention_backward", "dS = P * dP, the softmax backward's row sum left out",
       "dscores = softmax_backward(dP, c_softmax, out=dP)", "dscores = weights * dP",
       "check-attention-backward", hint="without its row sum")
mutant("attention_backward", "1 / sqrt(d_k) in place of the cached scale",
       "    weights = c_softmax  # (..., T, S)\n",
       "    weights = c_softmax  # (..., T, S)\n    scale = 1 / math.sqrt(q.shape[-1])\n",
       "check-attention-backward")
mutant("attention_backward", "without the scale in dq",
       "dq = dscores @ k * scale", "dq = dscores @ k", "check-attention-backward",
       hint="without the scale in dq (dk has it")
mutant("attention_backward", "without the scale in dk",
       "dk = np.swapaxes(dscores, -1, -2) @ q * scale", "dk = np.swapaxes(dscores, -1, -2) @ q",
       "check-attention-backward", hint="without the scale in dk (dq has it")
mutant("attention_backward", "dweights added into in place (the caller's array changes)",
       "        dP += dweights", "        dweights += dP\n        dP = dweights",
       "check-attention-backward", hint="changed its argument dweights")
mutant("attention_backward", "dweights ignored",
       "    if dweights is not None:\n        dP += dweights\n", "", "check-attention-backward")
mutant("attention_backward", "dk = dS q (dS not transposed)",
       "dk = np.swapaxes(dscores, -1, -2) @ q * scale", "dk = dscores @ q * scale",
       "check-attention-backward")
mutant("attention_backward", "dv = P dout (P not transposed)",
       "dv = np.swapaxes(weights, -1, -2) @ dout", "dv = weights @ dout",
       "check-attention-backward")
mutant("attention_backward", "the softmax backward skipped (dP used for dS)",
       "dscores = softmax_backward(dP, c_softmax, out=dP)", "dscores = dP",
       "check-attention-backward")
mutant("attention_backward", "the scale applied twice in dk",
       "dk = np.swapaxes(dscores, -1, -2) @ q * scale",
       "dk = np.swapaxes(dscores, -1, -2) @ (q * scale) * scale", "check-attention-backward")

mutant("multi_head_attention_backward", "a loop over the heads",
       "dq, dk, dv = attention_backward(dheads, c_att, dweights)",
       "q, k, v, P, scale = c_att\n"
       "    parts = [attention_backward(dheads[:, h:h + 1], (q[:, h:h + 1], k[:, h:h + 1], "
       "v[:, h:h + 1], P[:, h:h + 1], scale),\n"
       "        None if dweights is None else dweights[:, h:h + 1]) for h in range(num_heads)]\n"
       "    dq, dk, dv = (np.concatenate(g, axis=1) for g in zip(*parts))",
       "check-mha-backward", hint="runs a Python loop")
mutant("multi_head_attention_backward", "dweights not passed on",
       "attention_backward(dheads, c_att, dweights)", "attention_backward(dheads, c_att)",
       "check-mha-backward")
mutant("multi_head_attention_backward", "dkey computed from dv (copy-paste)",
       "dkey, g_k = linear_backward(merge_heads(dk), c_k)",
       "dkey, g_k = linear_backward(merge_heads(dv), c_k)", "check-mha-backward")
mutant("multi_head_attention_backward", "the input biases' gradients only when b_o exists",
       "for name, g in ((\"b_q\", g_q), (\"b_k\", g_k), (\"b_v\", g_v), (\"b_o\", g_o)):\n"
       "        if \"b\" in g:  # each bias on its own: a layer may have some and not others\n"
       "            grads[name] = g[\"b\"]",
       "if \"b\" in g_o:\n"
       "        grads.update(b_q=g_q[\"b\"], b_k=g_k[\"b\"], b_v=g_v[\"b\"], b_o=g_o[\"b\"])",
       "check-mha-backward")
mutant("multi_head_attention_backward", "the gradient of b_o only when the input biases exist",
       "for name, g in ((\"b_q\", g_q), (\"b_k\", g_k), (\"b_v\", g_v), (\"b_o\", g_o)):\n"
       "        if \"b\" in g:  # each bias on its own: a layer may have some and not others\n"
       "            grads[name] = g[\"b\"]",
       "if \"b\" in g_q:\n"
       "        grads.update(b_q=g_q[\"b\"], b_k=g_k[\"b\"], b_v=g_v[\"b\"], b_o=g_o[\"b\"])",
       "check-mha-backward")
mutant("multi_head_attention_backward", "the heads not split for the backward (merged dheads)",
       "dheads = split_heads(dheads, num_heads)  # (B, H, T, Dh)",
       "dheads = dheads.reshape(dheads.shape[0], num_heads, dheads.shape[1], -1)",
       "check-mha-backward")

mutant("self_attention_backward", "the gradient of b_o only when b_qkv exists",
       "if \"b\" in g_qkv:  # each bias on its own: b_qkv without b_o, or the reverse\n"
       "        grads[\"b_qkv\"] = g_qkv[\"b\"]\n"
       "    if \"b\" in g_o:\n        grads[\"b_o\"] = g_o[\"b\"]",
       "if \"b\" in g_qkv:\n        grads.update(b_qkv=g_qkv[\"b\"], b_o=g_o[\"b\"])",
       "check-self-attention-backward")
mutant("self_attention_backward", "the gradient of b_qkv only when b_o exists",
       "if \"b\" in g_qkv:  # each bias on its own: b_qkv without b_o, or the reverse\n"
       "        grads[\"b_qkv\"] = g_qkv[\"b\"]\n"
       "    if \"b\" in g_o:\n        grads[\"b_o\"] = g_o[\"b\"]",
       "if \"b\" in g_o:\n        grads.update(b_qkv=g_qkv[\"b\"], b_o=g_o[\"b\"])",
       "check-self-attention-backward")
mutant("self_attention_backward", "the key path of dx forgotten",
       "merge_heads(dq), merge_heads(dk), merge_heads(dv)",
       "merge_heads(dq), 0 * merge_heads(dk), merge_heads(dv)", "check-self-attention-backward")
mutant("self_attention_backward", "dweights not passed on",
       "attention_backward(dheads, c_att, dweights)", "attention_backward(dheads, c_att)",
       "check-self-attention-backward")
mutant("self_attention_backward", "dq, dk, dv stacked in the wrong order (k, q, v)",
       "merge_heads(dq), merge_heads(dk), merge_heads(dv)",
       "merge_heads(dk), merge_heads(dq), merge_heads(dv)", "check-self-attention-backward")

mutant("layer_norm_forward", "the one-pass variance mean(x * x) - mean(x)**2 (cancels)",
       'var = np.einsum("...j,...j->...", xc, xc)[..., None] / d',
       "var = (x * x).mean(axis=-1, keepdims=True) - x.mean(axis=-1, keepdims=True) ** 2",
       "check-layer-norm-forward")
mutant("layer_norm_forward", "eps added to the standard deviation",
       "rstd = 1 / np.sqrt(var + eps)", "rstd = 1 / (np.sqrt(var) + eps)",
       "check-layer-norm-forward")
mutant("layer_norm_forward", "eps ignored (the default 1e-5 written in)",
       "rstd = 1 / np.sqrt(var + eps)", "rstd = 1 / np.sqrt(var + 1e-5)",
       "check-layer-norm-forward", "check-layer-norm-backward")
mutant("layer_norm_forward", "the unbiased variance (D - 1)",
       "[..., None] / d  # mean(xc * xc)", "[..., None] / (d - 1)  # mean(xc * xc)",
       "check-layer-norm-forward")
mutant("layer_norm_forward", "beta added only when gamma is given",
       "    if beta is not None:\n        out += beta",
       "    if beta is not None and gamma is not None:\n        out += beta",
       "check-layer-norm-forward", hint="leaving beta out when gamma is None")
mutant("layer_norm_forward", "the mean not subtracted (x used for xc)",
       "xc = x - np.einsum(\"...j->...\", x)[..., None] / d", "xc = x",
       "check-layer-norm-forward", hint="without subtracting the mean")
mutant("layer_norm_forward", "the cached xhat scaled and shifted in place (out = xhat)",
       "out = xhat * gamma if gamma is not None else xhat.copy()",
       "out = xhat\n    if gamma is not None:\n        out *= gamma", "check-layer-norm-forward")
mutant("layer_norm_forward", "the standard deviation cached in place of its inverse",
       "    rstd = 1 / np.sqrt(var + eps)  # (..., 1)\n    xhat = xc * rstd\n",
       "    rstd = np.sqrt(var + eps)  # (..., 1)\n    xhat = xc / rstd\n",
       "check-layer-norm-forward")
mutant("layer_norm_backward", "mean(g) by a loop over the rows",
       'mean_g = np.einsum("...j->...", g)[..., None] / d',
       "mean_g = np.array([row.mean() for row in g.reshape(-1, d)]).reshape(*g.shape[:-1], 1)",
       "check-layer-norm-backward", hint="runs a Python loop")
mutant("layer_norm_backward", "dgamma and dbeta summed over the features, not the leading axes",
       'grads["gamma"] = (dout * xhat).reshape(-1, d).sum(axis=0)\n'
       '    if beta is not None:\n        grads["beta"] = dout.reshape(-1, d).sum(axis=0)',
       'grads["gamma"] = (dout * xhat).sum(axis=-1)\n'
       '    if beta is not None:\n        grads["beta"] = dout.sum(axis=-1)',
       "check-layer-norm-backward", hint="over the features (the last axis)")
mutant("layer_norm_backward", "dgamma and dbeta summed over the first axis only (2-D habit)",
       'grads["gamma"] = (dout * xhat).reshape(-1, d).sum(axis=0)\n'
       '    if beta is not None:\n        grads["beta"] = dout.reshape(-1, d).sum(axis=0)',
       'grads["gamma"] = (dout * xhat).sum(axis=0)\n'
       '    if beta is not None:\n        grads["beta"] = dout.sum(axis=0)',
       "check-layer-norm-backward", hint="over the first axis only")
mutant("layer_norm_backward", "the factor rstd forgotten in dx",
       "    dx *= rstd\n", "", "check-layer-norm-backward", hint="without the factor rstd")
mutant("layer_norm_backward", "mean(dout * xhat) where mean(g * xhat) belongs",
       'mean_gx = np.einsum("...j,...j->...", g, xhat)',
       'mean_gx = np.einsum("...j,...j->...", dout, xhat)', "check-layer-norm-backward")
mutant("layer_norm_backward", "the term xhat * mean(g * xhat) dropped",
       "    dx -= xhat * mean_gx\n", "", "check-layer-norm-backward")
mutant("layer_norm_backward", "divided by rstd (the sketch's sigma)", "    dx *= rstd\n",
       "    dx /= rstd\n", "check-layer-norm-backward", hint="dividing by rstd")
mutant("layer_norm_backward", "sums where the means belong",
       'mean_g = np.einsum("...j->...", g)[..., None] / d  # (..., 1)\n'
       '    mean_gx = np.einsum("...j,...j->...", g, xhat)[..., None] / d',
       'mean_g = np.einsum("...j->...", g)[..., None]  # (..., 1)\n'
       '    mean_gx = np.einsum("...j,...j->...", g, xhat)[..., None]',
       "check-layer-norm-backward", hint="summing where layer norm's backward takes means")
mutant("layer_norm_backward", "gamma twice in dgamma (g * xhat summed)",
       'grads["gamma"] = (dout * xhat).reshape(-1, d).sum(axis=0)',
       'grads["gamma"] = (dout * gamma * xhat).reshape(-1, d).sum(axis=0)',
       "check-layer-norm-backward", hint="with gamma twice in dgamma")
mutant("layer_norm_backward", "the term mean(g) dropped", "dx = g - mean_g", "dx = g.copy()",
       "check-layer-norm-backward")
mutant("layer_norm_backward", "dout used where g = dout * gamma belongs",
       "g = dout * gamma if gamma is not None else dout", "g = dout",
       "check-layer-norm-backward")
mutant("layer_norm_backward", "dgamma averaged over the rows",
       "grads[\"gamma\"] = (dout * xhat).reshape(-1, d).sum(axis=0)",
       "grads[\"gamma\"] = (dout * xhat).reshape(-1, d).mean(axis=0)",
       "check-layer-norm-backward")
mutant("layer_norm_backward", "dbeta given only with gamma",
       "    if beta is not None:\n        grads[\"beta\"]",
       "    if beta is not None and gamma is not None:\n        grads[\"beta\"]",
       "check-layer-norm-backward")

mutant("log_softmax_forward", "the maximum of the whole array instead of each row's",
       "z = x - x.max(axis=-1, keepdims=True)", "z = x - x.max()", "check-log-softmax")
mutant("log_softmax_forward", "without subtracting the maximum (exp overflows)",
       "z = x - x.max(axis=-1, keepdims=True)", "z = x", "check-log-softmax")
mutant("log_softmax_forward", "the log-sum without keepdims",
       "np.log(np.exp(z).sum(axis=-1, keepdims=True))", "np.log(np.exp(z).sum(axis=-1))",
       "check-log-softmax")
mutant("log_softmax_backward", "exp written into the cached log-probabilities (out=out)",
       "np.exp(out) * dout", "np.exp(out, out=out) * dout", "check-log-softmax",
       "check-cross-entropy", hint="writes into an array that its forward pass cached")
mutant("log_softmax_backward", "softmax's backward instead of log-softmax's",
       "return dout - np.exp(out) * dout.sum(axis=-1, keepdims=True)",
       "y = np.exp(out)\n    return y * (dout - (dout * y).sum(axis=-1, keepdims=True))",
       "check-log-softmax")
mutant("log_softmax_backward", "the row sum forgotten",
       "np.exp(out) * dout.sum(axis=-1, keepdims=True)", "np.exp(out) * dout",
       "check-log-softmax")
mutant("log_softmax_backward", "the row sum without keepdims",
       "dout.sum(axis=-1, keepdims=True)", "dout.sum(axis=-1)", "check-log-softmax")

mutant("cross_entropy_forward", "the loss left a NumPy scalar of the logits' dtype",
       "loss = -float((picked * keep).sum() * weight)",
       "loss = -(picked * keep).sum() * picked.dtype.type(weight)", "check-cross-entropy")
mutant("cross_entropy_forward", "the mean over every entry, padding included",
       "1 / keep.sum()", "1 / keep.size", "check-cross-entropy")
mutant("cross_entropy_forward", "ignore_index ignored (-100 written in)",
       "keep = targets != ignore_index", "keep = targets != -100", "check-cross-entropy")
mutant("cross_entropy_forward", "reduction ignored (always the mean)",
       "weight = 1 / keep.sum() if reduction == \"mean\" else 1.0", "weight = 1 / keep.sum()",
       "check-cross-entropy")
mutant("cross_entropy_forward", "the loss of the padded positions counted",
       "loss = -float((picked * keep).sum() * weight)", "loss = -float(picked.sum() * weight)",
       "check-cross-entropy")
mutant("cross_entropy_backward", "the one-hot made by a loop over the positions",
       "onehot = np.arange(c_logp.shape[-1]) == safe[..., None]",
       "onehot = np.stack([np.arange(c_logp.shape[-1]) == t for t in safe.ravel()]).reshape("
       "c_logp.shape)", "check-cross-entropy", hint="runs a Python loop")
mutant("cross_entropy_backward", "dloss ignored",
       "(-dloss * weight * keep)", "(-weight * keep)", "check-cross-entropy")
mutant("cross_entropy_backward", "the 1/count of the mean forgotten",
       "(-dloss * weight * keep)", "(-dloss * keep)", "check-cross-entropy")
mutant("cross_entropy_backward", "the padded positions given a gradient",
       "(-dloss * weight * keep)", "(-dloss * weight * np.ones_like(keep))",
       "check-cross-entropy")

mutant("embedding_forward", "the ids flattened (the batch axes lost)",
       "out = W[ids]", "out = W[ids.reshape(-1)]", "check-embedding")
mutant("embedding_backward", "dW[ids] += dout (a repeated id counted once)",
       "np.add.at(dW, ids.reshape(-1), dout.reshape(-1, shape[1]))",
       "dW[ids.reshape(-1)] += dout.reshape(-1, shape[1])", "check-embedding")
mutant("embedding_backward", "a Python loop over the positions (the text asks for np.add.at)",
       "np.add.at(dW, ids.reshape(-1), dout.reshape(-1, shape[1]))",
       "for i, row in zip(ids.reshape(-1), dout.reshape(-1, shape[1]), strict=True):\n"
       "        dW[i] += row", "check-embedding", hint="runs a Python loop")
mutant("embedding_backward", "the table's gradient in float64 whatever dout's dtype",
       "dW = np.zeros(shape, dtype=dout.dtype)", "dW = np.zeros(shape)", "check-embedding")

TEMP = "05_attention_backward/exercise-softmax-temperature"
mutant(TEMP, "the factor 1/tau forgotten in dx", "dx = dz / tau", "dx = dz",
       "check-softmax-temperature")
mutant(TEMP, "dtau with the wrong sign", "dtau = float(-(dz * x).sum() / tau ** 2)",
       "dtau = float((dz * x).sum() / tau ** 2)", "check-softmax-temperature")
mutant(TEMP, "the row sum without keepdims", "(dy * y).sum(axis=-1, keepdims=True)",
       "(dy * y).sum(axis=-1)", "check-softmax-temperature")
mutant(TEMP, "dtau with tau instead of tau^2", "/ tau ** 2)", "/ tau)",
       "check-softmax-temperature")
mutant(TEMP, "dtau a 0-d array, not the float the docstring gives",
       "dtau = float(-(dz * x).sum() / tau ** 2)",
       "dtau = np.asarray(-(dz * x).sum() / tau ** 2)", "check-softmax-temperature")
BIAS = "05_attention_backward/exercise-score-bias-attention"
mutant(BIAS, "dA averaged over the leading axes", "dZ.reshape(-1, *dZ.shape[-2:]).sum(axis=0)",
       "dZ.reshape(-1, *dZ.shape[-2:]).mean(axis=0)", "check-score-bias-attention")
mutant(BIAS, "dA from dP, before the softmax backward",
       "dA = dZ.reshape(-1, *dZ.shape[-2:]).sum(axis=0)",
       "dA = dP.reshape(-1, *dP.shape[-2:]).sum(axis=0)", "check-score-bias-attention")
mutant(BIAS, "dA not summed over the leading axes",
       "dA = dZ.reshape(-1, *dZ.shape[-2:]).sum(axis=0)", "dA = dZ",
       "check-score-bias-attention")
mutant(BIAS, "1/sqrt(d_k) in dQ and dK instead of the scale given",
       "    dQ = scale * dZ @ K\n    dK = scale * np.swapaxes(dZ, -1, -2) @ Q",
       "    c = 1 / math.sqrt(Q.shape[-1])\n    dQ = c * dZ @ K\n"
       "    dK = c * np.swapaxes(dZ, -1, -2) @ Q", "check-score-bias-attention",
       hint="where the scale given belongs")
mutant(BIAS, "dA summed by a Python loop over the leading axes (the text asks for none)",
       "dA = dZ.reshape(-1, *dZ.shape[-2:]).sum(axis=0)",
       "flat = dZ.reshape(-1, *dZ.shape[-2:])\n    dA = np.zeros(dZ.shape[-2:])\n"
       "    for i in range(flat.shape[0]):\n        dA += flat[i]", "check-score-bias-attention",
       hint="runs a Python loop")
mutant(BIAS, "dK with dZ not transposed", "dK = scale * np.swapaxes(dZ, -1, -2) @ Q",
       "dK = scale * dZ @ Q", "check-score-bias-attention")
RMSB = "06_layers_backward/exercise-rms-norm-backward"
mutant(RMSB, "dgamma summed by a Python loop over the rows (the text asks for none)",
       "dgamma = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)",
       "rows = (dy * xhat).reshape(-1, x.shape[-1])\n"
       "    dgamma = sum(rows[i] for i in range(len(rows)))", "check-rms-norm-backward",
       hint="runs a Python loop")
mutant(RMSB, "mean(g) subtracted as in layer norm",
       "dx = (g - xhat * (g * xhat).mean(axis=-1, keepdims=True)) / r",
       "dx = (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, "
       "keepdims=True)) / r", "check-rms-norm-backward")
mutant(RMSB, "the path through r dropped", "dx = (g - xhat * (g * xhat).mean(axis=-1, "
       "keepdims=True)) / r", "dx = g / r", "check-rms-norm-backward")
mutant(RMSB, "dgamma averaged", "dgamma = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)",
       "dgamma = (dy * xhat).reshape(-1, x.shape[-1]).mean(axis=0)", "check-rms-norm-backward")
mutant(RMSB, "eps ignored (the default 1e-6 written in)",
       "mean(axis=-1, keepdims=True) + eps)", "mean(axis=-1, keepdims=True) + 1e-6)",
       "check-rms-norm-backward")


# ============================================================================================
# 07_blocks, 08_transformer: eps passed down, dropout with p = 1

mutant("encoder_layer_forward", "eps not passed to the first residual sublayer",
       "residual_forward(x, attend, params[\"norm1\"], norm_first, eps)",
       "residual_forward(x, attend, params[\"norm1\"], norm_first)", "check-encoder-layer")
mutant("encoder_layer_forward", "eps not passed to the feed-forward's residual sublayer",
       "residual_forward(x, feed, params[\"norm2\"], norm_first, eps)",
       "residual_forward(x, feed, params[\"norm2\"], norm_first)", "check-encoder-layer")
mutant("decoder_layer_forward", "the cross-attention's keys and values from x, not the memory",
       "multi_head_attention_forward(h, memory, memory,", "multi_head_attention_forward(h, h, h,",
       "check-decoder-layer", hint="keys and values from another sequence")
mutant("decoder_layer_forward", "eps not passed to the self-attention's residual sublayer",
       "residual_forward(x, attend, params[\"norm1\"], norm_first, eps)",
       "residual_forward(x, attend, params[\"norm1\"], norm_first)", "check-decoder-layer")
mutant("decoder_layer_forward", "eps not passed to the cross-attention's residual sublayer",
       "residual_forward(x, cross, params[\"norm2\"], norm_first, eps)",
       "residual_forward(x, cross, params[\"norm2\"], norm_first)", "check-decoder-layer")
mutant("decoder_layer_forward", "eps not passed to the feed-forward's residual sublayer",
       "residual_forward(x, feed, params[\"norm3\"], norm_first, eps)",
       "residual_forward(x, feed, params[\"norm3\"], norm_first)", "check-decoder-layer")
mutant("encoder_forward", "the final norm's beta read as always there",
       'params["norm"].get("beta")', 'params["norm"]["beta"]', "check-encoder-stack")
mutant("encoder_forward", "eps not passed to the layers",
       "norm_first, activation, eps)\n        caches", "norm_first, activation)\n        caches",
       "check-encoder-stack")
mutant("encoder_forward", "eps not passed to the final norm",
       "params[\"norm\"].get(\"beta\"),\n                                       eps)",
       "params[\"norm\"].get(\"beta\"))", "check-encoder-stack")
mutant("decoder_forward", "eps not passed to the layers",
       "norm_first, activation, eps)\n        caches", "norm_first, activation)\n        caches",
       "check-decoder-stack")
mutant("decoder_forward", "eps not passed to the final norm",
       "params[\"norm\"].get(\"beta\"),\n                                       eps)",
       "params[\"norm\"].get(\"beta\"))", "check-decoder-stack")
mutant("transformer_encode", "the config's eps not passed to the encoder",
       "c.norm_first, c.activation, c.eps)", "c.norm_first, c.activation)",
       "check-transformer-forward")
mutant("transformer_decode", "the target padding left out of the self-attention mask",
       "merge_masks(causal_mask(tgt_in.shape[1]), tgt_pad)",
       "merge_masks(causal_mask(tgt_in.shape[1]), None)", "check-transformer-forward")
mutant("transformer_decode", "the config's eps not passed to the decoder",
       "c.norm_first, c.activation, c.eps)", "c.norm_first, c.activation)",
       "check-transformer-forward")
mutant("encoder_forward", "eps not passed to the layers (seen through the model's backward)",
       "norm_first, activation, eps)\n        caches", "norm_first, activation)\n        caches",
       "check-transformer-backward")
mutant("residual_forward", "eps not passed to the layer norm",
       "layer_norm_forward(h, norm[\"gamma\"], norm.get(\"beta\"), eps)",
       "layer_norm_forward(h, norm[\"gamma\"], norm.get(\"beta\"))", "check-residual")
mutant("residual_forward", "eps not passed to the given norm (the GPT's)",
       "return normalize(h, norm, eps)", "return normalize(h, norm)", "check-residual-normalize",
       "check-gpt-block")
mutant("residual_forward", "the given norm ignored: always a layer norm",
       "if normalize is None:", "if True:", "check-residual-normalize", "check-modern-block")
mutant("residual_backward", "the given norm's backward ignored: always the layer norm's",
       "dx, g_norm = normalize_backward(dh, c_norm)",
       "dx, g_norm = layer_norm_backward(dh, c_norm)", "check-residual-normalize",
       "check-modern-block")
mutant("dropout_forward", "a mask cached in evaluation (the identity's cache is None)",
       "        return x, None", "        return x, (np.ones(x.shape, bool), 1.0)",
       "check-dropout", hint="where dropout is the identity")
mutant("dropout_forward", "the mask drawn as u < 1 - p (right in distribution, not the text's)",
       "keep = rng.random(x.shape) >= p", "keep = rng.random(x.shape) < 1 - p", "check-dropout",
       hint="drawing the mask another way")
mutant("dropout_forward", "p = 1 returns zeros and cache None (the backward passes dout)",
       "    keep = rng.random(x.shape) >= p\n",
       "    if p == 1:\n        return np.zeros_like(x), None\n"
       "    keep = rng.random(x.shape) >= p\n", "check-dropout",
       hint="returning cache None at p = 1")
mutant("dropout_forward", "a copy of x in evaluation (the identity returns x itself)",
       "        return x, None", "        return x.copy(), None", "check-dropout",
       hint="returning a new array")
mutant("dropout_forward", "the kept entries scaled by p instead of 1/(1 - p)",
       "scale = x.dtype.type(1 / (1 - p) if p < 1 else 0)", "scale = x.dtype.type(p)",
       "check-dropout", hint="scaling by p instead")
mutant("dropout_forward", "the kept entries scaled by 1/p instead of 1/(1 - p)",
       "scale = x.dtype.type(1 / (1 - p) if p < 1 else 0)", "scale = x.dtype.type(1 / p)",
       "check-dropout", hint="scaling by 1/p instead")
mutant("dropout_forward", "the scale 1/(1 - p) computed for p = 1 too (a division by zero, "
       "where PyTorch returns zeros)",
       "scale = x.dtype.type(1 / (1 - p) if p < 1 else 0)", "scale = x.dtype.type(1 / (1 - p))",
       "check-dropout")


# ============================================================================================
# 07_blocks, 08_transformer: the rest

mutant("gelu_forward", "erf(x / 2) instead of erf(x / sqrt 2)",
       "erf(x / c(math.sqrt(2)))", "erf(x / c(2))", "check-gelu")
mutant("gelu_forward", "x^2 instead of x^3 in the tanh approximation",
       "    t = x * x  #", "    t = x.copy()  #", "check-gelu")
mutant("gelu_forward", "approximate ignored (always the exact GELU)",
       "if approximate == \"none\":", "if True:", "check-gelu")
mutant("gelu_forward", "a NumPy float64 constant that promotes float32 inputs",
       "out = t + 1  #", "out = t + np.float64(1)  #", "check-gelu")
mutant("gelu_backward", "the term x * phi(x) of the exact derivative forgotten",
       "local = aux + x * c(1 / math.sqrt(2 * math.pi)) * np.exp(-0.5 * x * x)",
       "local = aux", "check-gelu")
mutant("gelu_backward", "(1 - t) instead of (1 - t^2) in the tanh derivative",
       "local *= 1 - aux * aux", "local *= 1 - aux", "check-gelu")
mutant("gelu_backward", "the 3 of the cube's derivative dropped (1 + 0.044715 x^2)",
       "local *= c(3 * 0.044715)", "local *= c(0.044715)", "check-gelu")
mutant("activation_forward", "the activation's keyword arguments not passed (gelu_tanh runs "
       "the exact GELU)", "out, cache = forward(x, **kwargs)", "out, cache = forward(x)",
       "check-activation")
mutant("activation_backward", "the ReLU's backward whatever the activation",
       "return ACTIVATIONS[activation][1](dout, inner)",
       "return ACTIVATIONS[\"relu\"][1](dout, inner)", "check-activation")
mutant("feed_forward_forward", "the activation argument not passed on: ReLU always",
       "a, c_act = activation_forward(h, activation)", 'a, c_act = activation_forward(h, "relu")',
       "check-feed-forward")
mutant("feed_forward_forward", "the second bias forgotten",
       "params[\"W2\"], params.get(\"b2\"))", "params[\"W2\"])", "check-feed-forward")
mutant("feed_forward_backward", "the two weights' gradients swapped",
       'grads = {"W1": g1["W"], "W2": g2["W"]}', 'grads = {"W1": g2["W"], "W2": g1["W"]}',
       "check-feed-forward", hint="with the two weights' gradients under each other's names")
mutant("feed_forward_backward", "the activation's backward skipped",
       "dh = activation_backward(da, c_act)", "dh = da", "check-feed-forward")
mutant("feed_forward_backward", "the biases' gradients swapped",
       "grads[\"b1\"] = g1[\"b\"]\n    if \"b\" in g2:\n        grads[\"b2\"] = g2[\"b\"]",
       "grads[\"b1\"] = g2[\"b\"]\n    if \"b\" in g2:\n        grads[\"b2\"] = g1[\"b\"]",
       "check-feed-forward")
mutant("feed_forward_backward", "both biases' gradients returned only when b1 exists (a layer "
       "with one bias but not the other)",
       "if \"b\" in g1:  # each bias on its own: a layer may have one without the other\n"
       "        grads[\"b1\"] = g1[\"b\"]\n    if \"b\" in g2:\n        grads[\"b2\"] = g2[\"b\"]",
       "if \"b\" in g1:\n        grads.update(b1=g1[\"b\"], b2=g2[\"b\"])", "check-feed-forward")
mutant("residual_forward", "pre-norm and post-norm swapped", "if norm_first:",
       "if not norm_first:", "check-residual")
mutant("residual_forward", "the residual connection of pre-norm forgotten",
       "out = x + y", "out = y", "check-residual", hint="without the residual connection")
mutant("residual_backward", "the identity path's gradient forgotten (pre-norm)",
       "        dx += dout\n", "", "check-residual")
mutant("residual_backward", "dout added where the norm's gradient ds belongs (post-norm)",
       "dx += ds", "dx += dout", "check-residual", hint="with dout added to dx where ds belongs")
mutant("residual_backward", "post-norm: dout given to the sublayer's backward instead of ds",
       "dx, *rest = sublayer_backward(ds, c_sub)", "dx, *rest = sublayer_backward(dout, c_sub)",
       "check-residual")
mutant("residual_backward", "pre-norm: the norm's backward first, the sublayer's on its result",
       "        dh, *rest = sublayer_backward(dout, c_sub)\n"
       "        dx, g_norm = normalize_backward(dh, c_norm)\n        dx += dout\n",
       "        dn, g_norm = normalize_backward(dout, c_norm)\n"
       "        dx, *rest = sublayer_backward(dn, c_sub)\n        dx += dout\n", "check-residual")
mutant("dropout_backward", "a cache of None not handled (evaluation, p = 0)",
       "    if cache is None:\n        return dout\n", "", "check-dropout",
       hint="unpacks a cache that is None")
mutant("dropout_backward", "the mask inverted in the backward", "return dout * keep * scale",
       "return dout * ~keep * scale", "check-dropout")
mutant("dropout_backward", "the mask ignored in the backward", "return dout * keep * scale",
       "return dout * scale", "check-dropout")
mutant("dropout_forward", "the entries kept where u < p", "keep = rng.random(x.shape) >= p",
       "keep = rng.random(x.shape) < p", "check-dropout")
mutant("dropout_forward", "train ignored (dropout in evaluation too)",
       "if not train or p == 0:", "if p == 0:", "check-dropout")
mutant("dropout_forward", "the kept entries not scaled",
       "return x * keep * scale, (keep, scale)", "return x * keep, (keep, scale)",
       "check-dropout")
mutant("dropout_backward", "the scale forgotten in the backward",
       "return dout * keep * scale", "return dout * keep", "check-dropout")
mutant("init_uniform", "the bound from the shape's last axis (the fan-out), not fan_in",
       "bound = 1 / math.sqrt(fan_in)", "bound = 1 / math.sqrt(shape[-1])", "check-init",
       hint="the fan-out")
mutant("init_uniform", "bound 1/fan_in instead of 1/sqrt(fan_in)",
       "bound = 1 / math.sqrt(fan_in)", "bound = 1 / fan_in", "check-init")
mutant("init_xavier", "the bound sqrt(6 / fan_in)", "bound = math.sqrt(6 / (fan_in + fan_out))",
       "bound = math.sqrt(6 / fan_in)", "check-init", hint="with the bound sqrt(6/fan_in)")
mutant("init_xavier", "a (fan_out, fan_in) draw, transposed (the generator's order differs)",
       "rng.uniform(-bound, bound, size=(fan_in, fan_out))",
       "rng.uniform(-bound, bound, size=(fan_out, fan_in)).T", "check-init",
       hint="drawing a (fan_out, fan_in) array and transposing it")
mutant("init_xavier", "sqrt(2 / (fan_in + fan_out)), the standard deviation, as the bound",
       "bound = math.sqrt(6 / (fan_in + fan_out))", "bound = math.sqrt(2 / (fan_in + fan_out))",
       "check-init")
mutant("init_xavier", "the shape (fan_out, fan_in)", "size=(fan_in, fan_out)",
       "size=(fan_out, fan_in)", "check-init")
mutant("positional_encoding", "sines and cosines swapped",
       "pe[:, 0::2] = np.sin(angles)\n    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])",
       "pe[:, 0::2] = np.cos(angles)\n    pe[:, 1::2] = np.sin(angles[:, : d_model // 2])",
       "check-positional-encoding")
mutant("positional_encoding", "base ignored (10000 written in)",
       "inv_freq = base ** (", "inv_freq = 10000.0 ** (", "check-positional-encoding")
mutant("positional_encoding", "the exponent i/d instead of 2i/d",
       "base ** (-np.arange(0, d_model, 2) / d_model)",
       "base ** (-np.arange((d_model + 1) // 2) / d_model)", "check-positional-encoding")
mutant("embed_forward", "the scale forgotten", "    x *= scale\n", "", "check-embed")
mutant("embed_forward", "the positions forgotten",
       "        x += positions[: ids.shape[1]]  # (T, E) broadcast over the batch\n",
       "        pass\n", "check-embed")
mutant("embed_forward", "the whole positions table added, not its first T rows",
       "x += positions[: ids.shape[1]]", "x += positions", "check-embed",
       hint="a row per position")
mutant("embed_backward", "the table's gradient not scaled", "    dtable *= scale\n", "",
       "check-embed")
mutant("embed_backward", "the positions' gradient averaged over the batch",
       "dx.sum(axis=0)", "dx.mean(axis=0)", "check-embed")
mutant("tied_output_forward", "the table used untransposed (x @ W_embed)",
       "linear_forward(x, W_embed.T)", "linear_forward(x, W_embed)", "check-tied-output",
       hint="multiplies transposed, x @ W.T")
mutant("tied_output_backward", "the table's gradient left as the gradient of W_embed.T",
       "grads = {\"W\": g[\"W\"].T}", "grads = {\"W\": g[\"W\"]}", "check-tied-output")
mutant("encoder_layer_forward", "the mask not passed to the self-attention",
       "num_heads, mask)", "num_heads)", "check-encoder-layer")
mutant("encoder_layer_forward", "the activation not passed to the feed-forward",
       "feed_forward_forward(h, params[\"ff\"], activation)",
       "feed_forward_forward(h, params[\"ff\"])", "check-encoder-layer")
mutant("encoder_layer_backward", "the feed-forward's gradient not passed on (dout used again)",
       "residual_backward(dx, c_sa, self_attention_backward)",
       "residual_backward(dout, c_sa, self_attention_backward)", "check-encoder-layer")
mutant("decoder_layer_forward", "the memory mask not passed to the cross-attention",
       "                                            memory_mask)",
       "                                            None)", "check-decoder-layer")
mutant("decoder_layer_forward", "the cross-attention's queries and keys swapped: queries from "
       "the memory, keys and values from the target", "multi_head_attention_forward(h, memory, "
       "memory,", "multi_head_attention_forward(memory, h, h,", "check-decoder-layer",
       hint="queries and the keys swapped")
mutant("decoder_layer_forward", "the target mask not passed to the self-attention",
       "num_heads, tgt_mask)", "num_heads)", "check-decoder-layer")
mutant("decoder_layer_backward", "the memory's gradient from the keys only",
       "dmemory = dkey + dvalue", "dmemory = dkey", "check-decoder-layer")
mutant("encoder_forward", "the mask not passed to the layers",
       "encoder_layer_forward(x, layer, num_heads, mask,",
       "encoder_layer_forward(x, layer, num_heads, None,", "check-encoder-stack")
mutant("encoder_backward", "the layers' gradients in reverse order",
       "g_layers.insert(0, g)", "g_layers.append(g)", "check-encoder-stack")
mutant("encoder_backward", "the final norm's backward skipped (its gradients kept)",
       "dout, g_norm = layer_norm_backward(dout, c_norm)",
       "g_norm = layer_norm_backward(dout, c_norm)[1]", "check-encoder-stack")
mutant("decoder_forward", "the memory mask not passed to the layers",
       "num_heads, tgt_mask, memory_mask,", "num_heads, tgt_mask, None,", "check-decoder-stack")
mutant("decoder_backward", "the memory's gradient of the last layer only",
       "dmemory = dmemory + dmem", "dmemory = dmem", "check-decoder-stack")
mutant("decoder_backward", "the layers' gradients in reverse order",
       "g_layers.insert(0, g)", "g_layers.append(g)", "check-decoder-stack")
mutant("transformer_encode", "the source padding ignored",
       "merge_masks(None, src_pad),  # (B, 1, 1, S) or None", "None,",
       "check-transformer-forward")
mutant("transformer_encode", "the embeddings always scaled by sqrt(E)",
       "scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0",
       "scale = math.sqrt(c.d_model)", "check-transformer-forward")
mutant("transformer_decode", "no causal mask in the decoder",
       "merge_masks(causal_mask(tgt_in.shape[1]), tgt_pad)", "merge_masks(None, tgt_pad)",
       "check-transformer-forward")
mutant("transformer_decode", "the source padding left out of the cross-attention",
       "merge_masks(None, src_pad), c.norm_first", "None, c.norm_first",
       "check-transformer-forward")
mutant("transformer_decode", "the output layer's bias read as params['out_proj']['b']",
       'params["out_proj"].get("b")', 'params["out_proj"]["b"]', "check-transformer-forward")
mutant("transformer_forward", "the source padding not passed to the decoder",
       "memory, config, pe, src_pad, tgt_pad)", "memory, config, pe, None, tgt_pad)",
       "check-transformer-forward")


# ============================================================================================
# 09_verification

mutant("transformer_backward", "the positions' gradients of source and target swapped",
       "src_pos={\"W\": d_src_pos}, tgt_pos={\"W\": d_tgt_pos}",
       "src_pos={\"W\": d_tgt_pos}, tgt_pos={\"W\": d_src_pos}", "check-transformer-backward")
mutant("transformer_backward", "the output layer's bias always given a gradient",
       '"decoder": g_dec, "out_proj": g_out}',
       '"decoder": g_dec, "out_proj": {**g_out, "b": dlogits.sum(axis=(0, 1))}}',
       "check-transformer-backward")
mutant("transformer_backward", "the decoder given dlogits, not the output layer's dy",
       "dy, dmemory, g_dec = decoder_backward(dy, c_dec)",
       "dy, dmemory, g_dec = decoder_backward(dlogits, c_dec)", "check-transformer-backward",
       hint="layer_norm_backward raised it, a function of an earlier notebook")
mutant("transformer_backward", "the memory's gradient divided by the decoder layers' number",
       "encoder_backward(dmemory, c_enc)", "encoder_backward(dmemory / len(c_dec[0]), c_enc)",
       "check-transformer-backward")
mutant("transformer_backward", "the memory's gradient not passed into the encoder",
       "dx, g_enc = encoder_backward(dmemory, c_enc)",
       "dx, g_enc = encoder_backward(0 * dmemory, c_enc)", "check-transformer-backward")
mutant("transformer_loss", "ignore_index not passed on (-100, not the model's padding label)",
       "cross_entropy_forward(logits, labels, ignore_index)",
       "cross_entropy_forward(logits, labels)", "check-transformer-loss")
mutant("transformer_loss", "-1 written in, the argument ignore_index ignored",
       "cross_entropy_forward(logits, labels, ignore_index)",
       "cross_entropy_forward(logits, labels, -1)", "check-transformer-loss")
BUG = "09_verification/exercise-find-the-bug"
mutant(BUG, "the first bug left: the scores scaled by sqrt(E)", "/ math.sqrt(head_dim)",
       "/ math.sqrt(e)", "check-find-the-bug")
mutant(BUG, "the second bug left: the heads merged without the transpose",
       "context.transpose(1, 2).reshape(batch, length, e)", "context.reshape(batch, length, e)",
       "check-find-the-bug")
mutant(BUG, "the padding mask over the queries",
       "key_padding_mask[:, None, None, :]", "key_padding_mask[:, None, :, None]",
       "check-find-the-bug")
SMOOTH = "09_verification/exercise-label-smoothing"
mutant(SMOOTH, "eps spread over V - 1 classes", "q = np.full(logits.shape, eps / V)",
       "q = np.full(logits.shape, eps / (V - 1))", "check-label-smoothing")
mutant(SMOOTH, "the gradient divided by every position, padding included",
       "(keep / count)[..., None]", "(keep / keep.size)[..., None]", "check-label-smoothing")
mutant(SMOOTH, "without the max subtraction (exp overflows)",
       "z = logits - logits.max(axis=-1, keepdims=True)", "z = logits", "check-label-smoothing")
mutant(SMOOTH, "a Python loop over the positions for q (the text asks for none)",
       "np.put_along_axis(q, labels[..., None], 1 - eps + eps / V, axis=-1)",
       "for b, t in np.ndindex(labels.shape):\n        q[b, t, labels[b, t]] = 1 - eps + eps / V",
       "check-label-smoothing", hint="runs a Python loop")
mutant(SMOOTH, "padding taken to be id 0, the argument pad_id unused", "keep = labels != pad_id",
       "keep = labels != 0", "check-label-smoothing", hint="with 0 as the padding's id")
POS = "09_verification/exercise-padded-positions"
mutant(POS, "a Python loop over the batch (the text asks for none)",
       "positions = np.cumsum(real, axis=1) - 1",
       "positions = np.array([np.cumsum(row) - 1 for row in real])", "check-padded-positions",
       hint="runs a Python loop")
mutant(POS, "positions counted from 1", "positions = np.cumsum(real, axis=1) - 1",
       "positions = np.cumsum(real, axis=1)", "check-padded-positions",
       hint="the positions counted from 1")
mutant(POS, "the padding not zeroed", "    out[~real] = 0.0\n", "", "check-padded-positions",
       hint="the padding not zeroed (its positions clipped at 0)")
mutant(POS, "the padding not zeroed, its positions not clipped (-1 before the first token)",
       "np.maximum(positions, 0)[..., None] * omega", "positions[..., None] * omega\n"
       "    out = np.empty(ids.shape + (d_model,))\n    out[..., 0::2] = np.sin(angles)\n"
       "    out[..., 1::2] = np.cos(angles[..., : d_model // 2])\n    return out",
       "check-padded-positions", hint="the padding not zeroed: its rows")
mutant(POS, "positions from the column index (left padding shifts them)",
       "positions = np.cumsum(real, axis=1) - 1",
       "positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)",
       "check-padded-positions", hint="each token's column as its position")
mutant(POS, "the exponent i/d for 2i/d", "np.arange(0, d_model, 2) / d_model",
       "np.arange((d_model + 1) // 2) / d_model", "check-padded-positions", hint="10000^(-i/d)")
mutant(POS, "sin and cos swapped", "np.sin(angles)\n    out[..., 1::2] = np.cos(",
       "np.cos(angles)\n    out[..., 1::2] = np.sin(", "check-padded-positions",
       hint="sin and cos swapped")
mutant(POS, "all the sines, then all the cosines",
       "    out = np.empty(ids.shape + (d_model,))\n    out[..., 0::2] = np.sin(angles)\n"
       "    out[..., 1::2] = np.cos(angles[..., : d_model // 2])\n",
       "    out = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)[..., :d_model]\n",
       "check-padded-positions", hint="all the sines, then all the cosines")


# ============================================================================================
# 10_training

mutant("sgd_step", "dampening * g in the buffer, not (1 - dampening) * g",
       "buf += c(1 - dampening) * g", "buf += c(dampening) * g", "check-sgd-step",
       hint="with dampening * g where (1 - dampening) * g belongs")
mutant("sgd_step", "nesterov ignored", "g = g + c(momentum) * buf if nesterov else buf",
       "g = buf", "check-sgd-step")
mutant("sgd_step", "the first momentum step damped too", "buf = g.copy()",
       "buf = c(1 - dampening) * g", "check-sgd-step")
mutant("sgd_step", "p not updated in place", "p -= c(lr) * g", "p = p - c(lr) * g",
       "check-sgd-step")
mutant("sgd_step", "weight decay ignored", "g = g + c(weight_decay) * p", "g = g",
       "check-sgd-step")
mutant("adam_step", "AdamW's shrink of p after the update instead of before",
       '    if weight_decay and decoupled:\n'
       '        p *= c(1 - lr * weight_decay)\n'
       '    elif weight_decay:\n'
       '        g = g + c(weight_decay) * p\n'
       "    m += c(1 - beta1) * (g - m)  # = b1 m + (1 - b1) g, as torch's m.lerp_(g, 1 - b1)\n"
       '    v *= c(beta2)\n'
       '    v += c(1 - beta2) * g * g\n'
       '    denom = np.sqrt(v) / c(math.sqrt(1 - beta2**t)) + c(eps)\n'
       '    p -= c(lr / (1 - beta1**t)) * m / denom\n',
       '    if weight_decay and not decoupled:\n'
       '        g = g + c(weight_decay) * p\n'
       "    m += c(1 - beta1) * (g - m)  # = b1 m + (1 - b1) g, as torch's m.lerp_(g, 1 - b1)\n"
       '    v *= c(beta2)\n'
       '    v += c(1 - beta2) * g * g\n'
       '    denom = np.sqrt(v) / c(math.sqrt(1 - beta2**t)) + c(eps)\n'
       '    p -= c(lr / (1 - beta1**t)) * m / denom\n'
       '    if weight_decay and decoupled:\n'
       '        p *= c(1 - lr * weight_decay)\n',
       "check-adam-step")
mutant("adam_step", "without the bias correction of v",
       "np.sqrt(v) / c(math.sqrt(1 - beta2**t))", "np.sqrt(v)", "check-adam-step")
mutant("adam_step", "beta1 in v's average (copied from m's line)",
       "    v *= c(beta2)\n    v += c(1 - beta2) * g * g",
       "    v *= c(beta1)\n    v += c(1 - beta1) * g * g", "check-adam-step",
       hint="with beta1 in v's running average")
mutant("adam_step", "the bias corrections applied to m and v themselves (m /= 1 - beta1**t)",
       "    denom = np.sqrt(v) / c(math.sqrt(1 - beta2**t)) + c(eps)\n"
       "    p -= c(lr / (1 - beta1**t)) * m / denom",
       "    m /= c(1 - beta1**t)\n    v /= c(1 - beta2**t)\n"
       "    p -= c(lr) * m / (np.sqrt(v) + c(eps))", "check-adam-step",
       hint="dividing m and v themselves")
mutant("adam_step", "decoupled weight decay without the learning rate",
       "p *= c(1 - lr * weight_decay)", "p *= c(1 - weight_decay)", "check-adam-step")
mutant("adam_step", "the moments not updated in place",
       "m += c(1 - beta1) * (g - m)", "m = m + c(1 - beta1) * (g - m)", "check-adam-step")
mutant("global_norm", "the sum of squares without the square root",
       "return math.sqrt(float(sum(squares)))", "return float(sum(squares))", "check-global-norm")
mutant("global_norm", "the largest array's norm instead of all together",
       "return math.sqrt(float(sum(squares)))", "return math.sqrt(float(max(squares)))",
       "check-global-norm")
mutant("clip_grad_norm", "small gradients scaled up too", "    if scale < 1:\n", "    if True:\n",
       "check-clip-grad-norm")
mutant("clip_grad_norm", "the norm after clipping returned",
       "    return total", "    return global_norm(grads)", "check-clip-grad-norm")
mutant("clip_grad_norm", "new arrays instead of scaling in place",
       "g *= g.dtype.type(scale)", "g = g * g.dtype.type(scale)", "check-clip-grad-norm")
mutant("clip_grad_norm", "new arrays in the dict instead of scaling in place",
       "for g in grads.values():\n            g *= g.dtype.type(scale)",
       "for k, g in grads.items():\n            grads[k] = g * g.dtype.type(scale)",
       "check-clip-grad-norm")
mutant("clip_grad_norm", "a loop over the dict's keys, not its arrays",
       "for g in grads.values():", "for g in grads:", "check-clip-grad-norm",
       hint="looping over a dict gives its keys")
mutant("adam_step", "beta1 and beta2 swapped", "    c = p.dtype.type\n",
       "    c = p.dtype.type\n    beta1, beta2 = beta2, beta1\n", "check-adam-step",
       hint="with beta1 and beta2 swapped")
mutant("adam_step", "v averaging g, not its square", "v += c(1 - beta2) * g * g",
       "v += c(1 - beta2) * g", "check-adam-step", hint="with v averaging g instead of g * g")
mutant("adam_step", "AdamW's decay added to the gradient too",
       "    elif weight_decay:\n", "    if weight_decay:\n", "check-adam-step",
       hint="as well as shrinking p")
mutant("adam_step", "eps added before v's bias correction",
       "denom = np.sqrt(v) / c(math.sqrt(1 - beta2**t)) + c(eps)",
       "denom = (np.sqrt(v) + c(eps)) / c(math.sqrt(1 - beta2**t))", "check-adam-step",
       hint="with eps added before v's bias correction")
mutant("adam_step", "the bias correction with t - 1 (steps counted from 0)",
       "c(lr / (1 - beta1**t))", "c(lr / (1 - beta1**(t - 1)))", "check-adam-step",
       hint="Adam's step t is 1 at the first update")
mutant("train_step", "clipping skipped",
       "norm = clip_grad_norm(grads, clip) if clip else global_norm(grads)",
       "norm = global_norm(grads)", "check-train-step")
mutant("train_step", "the learning rate not set", "    optimizer.lr = lr\n", "",
       "check-train-step")
NOAM = "10_training/exercise-noam-schedule"
mutant(NOAM, "a Python comprehension over the steps (the text asks for no loop)",
       "lr = d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -1.5)",
       "lr = np.array([d_model ** -0.5 * min(x ** -0.5, x * warmup ** -1.5) for x in s.ravel()]"
       ").reshape(s.shape)", "check-noam-schedule", hint="runs a Python loop")
mutant(NOAM, "the maximum of the two rates", "np.minimum(s ** -0.5", "np.maximum(s ** -0.5",
       "check-noam-schedule")
mutant(NOAM, "warmup^-0.5 instead of warmup^-1.5", "warmup ** -1.5", "warmup ** -0.5",
       "check-noam-schedule")
mutant(NOAM, "the factor d_model^-0.5 forgotten", "lr = d_model ** -0.5 * np.minimum(",
       "lr = np.minimum(", "check-noam-schedule")
RMSP = "10_training/exercise-rmsprop"
mutant(RMSP, "centered ignored", "if centered:", "if False:", "check-rmsprop")
mutant(RMSP, "eps inside the square root", "avg = np.sqrt(st[\"v\"]) + eps",
       "avg = np.sqrt(st[\"v\"] + eps)", "check-rmsprop")
mutant(RMSP, "weight decay ignored", "g = g + weight_decay * p", "g = g", "check-rmsprop")
mutant(RMSP, "lr folded into the momentum buffer (right while lr is constant)",
       "            st[\"buf\"] = momentum * st[\"buf\"] + g / avg\n"
       "            p -= lr * st[\"buf\"]",
       "            st[\"buf\"] = momentum * st[\"buf\"] + lr * g / avg\n"
       "            p -= st[\"buf\"]", "check-rmsprop")
SAMPLE = "10_training/exercise-sample-decode"
mutant(SAMPLE, "temperature ignored", "z = logits[:, -1].astype(np.float64) / temperature",
       "z = logits[:, -1].astype(np.float64)", "check-sample-decode")
mutant(SAMPLE, "finished sequences not padded", "        nxt = np.where(done, c.pad_id, nxt)\n",
       "", "check-sample-decode", hint="the tokens drawn on after </s>")
mutant(SAMPLE, "a row marked done before its token is padded: </s> itself becomes <pad>",
       "        nxt = np.where(done, c.pad_id, nxt)\n",
       "        done |= nxt == c.eos_id\n        nxt = np.where(done, c.pad_id, nxt)\n",
       "check-sample-decode", hint="</s> itself replaced by <pad>")
mutant(SAMPLE, "never stopping early", "        if done.all():\n            break\n", "",
       "check-sample-decode", hint="all max_len steps taken")
mutant(SAMPLE, "the <s> column dropped", "            break\n",
       "            break\n    out = out[:, 1:]\n",
       "check-sample-decode", hint="the <s> column left out")
mutant(SAMPLE, "max_len + 1 steps", "for _ in range(max_len):", "for _ in range(max_len + 1):",
       "check-sample-decode", hint="max_len + 1 steps")
mutant(SAMPLE, "the first position's logits", "z = logits[:, -1]", "z = logits[:, 0]",
       "check-sample-decode", hint="the logits of the first position")
mutant(SAMPLE, "the most likely token instead of a draw",
       "nxt = np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)",
       "nxt = p.argmax(axis=-1)", "check-sample-decode")
mutant(SAMPLE, "a loop over the batch inside the loop over the steps (the text asks for none)",
       "nxt = np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)",
       "cdf = np.cumsum(p, axis=-1)\n"
       "        nxt = np.array([min(int((cdf[i] < u[i]).sum()), p.shape[-1] - 1) "
       "for i in range(b)])", "check-sample-decode", hint="runs a Python loop")


# ============================================================================================
# 13_gpt, 14_decoding, 15_modern_block (and the GPT's use of 04 and 05's functions)

mutant("next_token_loss_forward", "the logits not shifted (each position scored against "
       "its own token)", "cross_entropy_forward(logits[:, :-1], ids[:, 1:])",
       "cross_entropy_forward(logits, ids)", "check-next-token-loss",
       hint="or a block of every position where the shifted T - 1 belong")
mutant("next_token_loss_forward", "the mean over B * T positions, not the B * (T - 1) scored",
       "loss, c_ce = cross_entropy_forward(logits[:, :-1], ids[:, 1:])  # (B, T-1, V) vs (B, T-1)",
       "loss, c_ce = cross_entropy_forward(logits[:, :-1], ids[:, 1:])  # (B, T-1, V) vs (B, T-1)"
       "\n    loss = loss * (ids.shape[1] - 1) / ids.shape[1]", "check-next-token-loss")
mutant("next_token_loss_backward", "the gradient put at positions 1.. instead of ..T-1",
       "dlogits[:, :-1] = d_shifted", "dlogits[:, 1:] = d_shifted", "check-next-token-loss")
mutant("next_token_loss_backward", "dloss ignored (the gradient as if dloss were 1)",
       "cross_entropy_backward(dloss, c_ce)", "cross_entropy_backward(1.0, c_ce)",
       "check-next-token-loss")
mutant("rope_tables", "the positions one too far (p + 1)",
       "angles = np.asarray(positions, dtype=np.float64)[:, None] * omega",
       "angles = (np.asarray(positions, dtype=np.float64)[:, None] + 1) * omega", "check-rope",
       hint="the positions one too far")
mutant("rope_tables", "the frequencies base^(-i/Dh) instead of base^(-2i/Dh)",
       "base ** (-np.arange(0, head_dim, 2) / head_dim)",
       "base ** (-np.arange(head_dim // 2) / head_dim)", "check-rope")
mutant("rope_tables", "the base 10000 written in, the argument base ignored",
       "omega = base ** (", "omega = 10000.0 ** (", "check-rope")
mutant("rope_forward", "cos and sin swapped in the rotation",
       "    out[..., 0::2] = x0 * cos - x1 * sin\n    out[..., 1::2] = x0 * sin + x1 * cos\n",
       "    out[..., 0::2] = x0 * sin - x1 * cos\n    out[..., 1::2] = x0 * cos + x1 * sin\n",
       "check-rope", hint="cos and sin swapped")
mutant("rope_forward", "the rotation by minus the angle (clockwise, not RoFormer's +p omega)",
       "out[..., 0::2] = x0 * cos - x1 * sin\n    out[..., 1::2] = x0 * sin + x1 * cos",
       "out[..., 0::2] = x0 * cos + x1 * sin\n    out[..., 1::2] = x1 * cos - x0 * sin",
       "check-rope")
mutant("rope_forward", "the halves rotated together (GPT-NeoX's rotate_half), not the pairs",
       "x0, x1 = x[..., 0::2], x[..., 1::2]  # (..., T, Dh/2) each\n    out = np.empty_like(x)\n"
       "    out[..., 0::2] = x0 * cos - x1 * sin\n    out[..., 1::2] = x0 * sin + x1 * cos",
       "h = x.shape[-1] // 2\n    x0, x1 = x[..., :h], x[..., h:]\n    out = np.empty_like(x)\n"
       "    out[..., :h] = x0 * cos - x1 * sin\n    out[..., h:] = x0 * sin + x1 * cos",
       "check-rope", "check-grouped-query-attention")
mutant("rope_backward", "the forward's rotation in the backward (not its transpose)",
       "dx[..., 0::2] = d0 * cos + d1 * sin\n    dx[..., 1::2] = d1 * cos - d0 * sin",
       "dx[..., 0::2] = d0 * cos - d1 * sin\n    dx[..., 1::2] = d0 * sin + d1 * cos",
       "check-rope")
mutant("rope_backward", "the cached table sin negated in place: the next layer's rotation turns",
       "dx[..., 0::2] = d0 * cos + d1 * sin\n    dx[..., 1::2] = d1 * cos - d0 * sin",
       "sin *= -1\n    dx[..., 0::2] = d0 * cos - d1 * sin\n"
       "    dx[..., 1::2] = d0 * sin + d1 * cos", "check-rope",
       hint="writes into an array that its forward pass cached")
mutant("rms_norm_forward", "eps = 1e-5 written in, the argument eps ignored",
       "/ d + eps)", "/ d + 1e-5)", "check-gpt-rms-norm")
mutant("rms_norm_forward", "eps added outside the square root",
       "rstd = 1 / np.sqrt(np.einsum(\"...j,...j->...\", x, x)[..., None] / d + eps)",
       "rstd = 1 / (np.sqrt(np.einsum(\"...j,...j->...\", x, x)[..., None] / d) + eps)",
       "check-gpt-rms-norm")
mutant("rms_norm_backward", "gamma left out of dx", "    g = dout * gamma\n", "    g = dout\n",
       "check-gpt-rms-norm", hint="without gamma in dx")
mutant("rms_norm_backward", "the factor 1/r forgotten in dx", "    dx *= rstd\n", "",
       "check-gpt-rms-norm", hint="without the factor 1 / r")
mutant("rms_norm_backward", "the path through the rms dropped", "dx = g - xhat * mean_gx",
       "dx = g.copy()", "check-gpt-rms-norm")
mutant("silu_forward", "the sigmoid returned, not x times it",
       "    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)\n",
       "    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)\n    return s, (x, s)\n",
       "check-swiglu", hint="with sigmoid(a) where silu(a)")
mutant("silu_forward", "sigmoid(2x) written for sigmoid(x)", "np.tanh(0.5 * x)", "np.tanh(x)",
       "check-swiglu")
mutant("silu_backward", "x * s instead of x * (1 - s)", "(1 + x * (1 - s))", "(1 + x * s)",
       "check-swiglu")
mutant("silu_forward", "the sigmoid as exp(x) / (1 + exp(x)), which overflows (NaN past 89 in "
       "float32)", "s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)",
       "s = np.exp(x) / (1 + np.exp(x))", "check-swiglu")
mutant("silu_forward", "x multiplied by its sigmoid in place (x *= s): the input changes",
       "    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)\n",
       "    s = 0.5 * (1 + np.tanh(0.5 * x))  # sigmoid(x)\n    x0 = x.copy()\n    x *= s\n"
       "    return x, (x0, s)\n", "check-swiglu", hint="changed its input `x` in place")
mutant("swiglu_forward", "silu of the product of the two paths, silu(a * u)",
       "    s, c_silu = silu_forward(a)\n",
       "    s, c_silu = silu_forward(a * u)\n    u = np.ones_like(u)\n", "check-swiglu",
       hint="with silu of the product")
mutant("swiglu_backward", "the gate's and the up projection's weight gradients swapped",
       "    dx, g_gate = linear_backward(da, c_gate)\n    dx_up, g_up = linear_backward(dh * s, "
       "c_up)\n", "    dx, g_up = linear_backward(da, c_gate)\n    dx_up, g_gate = "
       "linear_backward(dh * s, c_up)\n", "check-swiglu", hint="under each other's keys")
mutant("swiglu_forward", "the gate's input multiplied in instead of its SiLU",
       "linear_forward(s * u, params[\"W_down\"])", "linear_forward(a * u, params[\"W_down\"])",
       "check-swiglu")
mutant("swiglu_backward", "the two paths' factors crossed (da from dh * s, du = dh * u)",
       "    da = silu_backward(dh * u, c_silu)\n    dx, g_gate = linear_backward(da, c_gate)\n"
       "    dx_up, g_up = linear_backward(dh * s, c_up)\n",
       "    da = silu_backward(dh * s, c_silu)\n    dx, g_gate = linear_backward(da, c_gate)\n"
       "    dx_up, g_up = linear_backward(dh * u, c_up)\n",
       "check-swiglu", hint="the two paths' factors crossed")
mutant("swiglu_backward", "the up projection's path of dx forgotten", "    dx += dx_up\n", "",
       "check-swiglu")
mutant("swiglu_forward", "SiLU on the up projection too: silu(a) * silu(u)",
       "out, c_down = linear_forward(s * u,",
       "s_up, _ = silu_forward(u)\n    out, c_down = linear_forward(s * s_up,", "check-swiglu",
       hint="silu on the up projection too")
mutant("repeat_kv_forward", "the key/value heads tiled instead of repeated",
       "out = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, S, Dh))",
       "out = np.broadcast_to(x[:, None], (B, n_rep, Hkv, S, Dh))",
       "check-grouped-query-attention")
mutant("repeat_kv_forward", "the positions repeated, not the heads (axis 2)",
       "    out = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, S, Dh))  # a view, no copy yet\n"
       "    return out.reshape(B, Hkv * n_rep, S, Dh), n_rep\n",
       "    return np.repeat(x, n_rep, axis=2), n_rep\n", "check-grouped-query-attention",
       hint="repeat_kv gives each key/value head to n_rep query heads")
mutant("repeat_kv_forward", "the repeated heads returned alone, without the cache n_rep",
       "return out.reshape(B, Hkv * n_rep, S, Dh), n_rep",
       "return out.reshape(B, Hkv * n_rep, S, Dh)", "check-grouped-query-attention",
       hint="repeat_kv_forward returned what does not unpack into (out, cache)")
mutant("repeat_kv_backward", "the gradients summed over the tiled grouping",
       "dout.reshape(B, H // n_rep, n_rep, S, Dh).sum(axis=2)",
       "dout.reshape(B, n_rep, H // n_rep, S, Dh).sum(axis=1)", "check-grouped-query-attention",
       hint="summing the query heads' gradients in tile order")
mutant("repeat_kv_backward", "the mean of the query heads' gradients instead of their sum",
       "dout.reshape(B, H // n_rep, n_rep, S, Dh).sum(axis=2)",
       "dout.reshape(B, H // n_rep, n_rep, S, Dh).mean(axis=2)", "check-grouped-query-attention",
       hint="averaging the gradients")
mutant("repeat_kv_backward", "one query head's gradient kept of each key/value head (no sum)",
       "dout.reshape(B, H // n_rep, n_rep, S, Dh).sum(axis=2)", "dout[:, ::n_rep]",
       "check-grouped-query-attention", hint="keeping one query head's gradient")
mutant("self_attention_forward", "keys and values at full width E (grouped-query attention)",
       "kv = Hkv * (E // num_heads)", "kv = E", "check-grouped-query-attention")
mutant("self_attention_forward", "the packed projection cut in three equal parts, as before "
       "grouped-query attention", "np.split(qkv, [E, E + kv], axis=-1)",
       "np.split(qkv, 3, axis=-1)", "check-grouped-query-attention", hint="cut at the columns")
mutant("self_attention_forward", "the kernel passed in ignored", "heads, c_att = attend(q, k, v)",
       "heads, c_att = attention_forward(q, k, v, mask)", "check-causal-self-attention")
mutant("self_attention_backward", "the kernel's backward ignored",
       "dq, dk, dv = attend_backward(dheads, c_att)",
       "dq, dk, dv = attention_backward(dheads, c_att)", "check-causal-self-attention")
mutant("causal_self_attention_forward", "no causal mask",
       "attention_forward(q, k, v, causal_mask(q.shape[2]))", "attention_forward(q, k, v)",
       "check-causal-self-attention")
mutant("causal_self_attention_forward", "the causal mask transposed (the past blocked)",
       "attention_forward(q, k, v, causal_mask(q.shape[2]))",
       "attention_forward(q, k, v, causal_mask(q.shape[2]).T)", "check-causal-self-attention",
       hint="with the mask the wrong way round")
mutant("causal_self_attention_forward", "block_size ignored: the naive kernel always",
       "if block_size is None:\n            heads, c_att = attention_forward(",
       "if True:\n            heads, c_att = attention_forward(", "check-gpt-tiled-attention",
       hint="your backward unpacks a cache of another length than your forward returned")
mutant("causal_self_attention_forward", "block_size ignored in the tiled branch: the default",
       "heads, c_att = flash_attention_forward(q, k, v, True, block_size)",
       "heads, c_att = flash_attention_forward(q, k, v, True)", "check-gpt-tiled-attention",
       hint="with block_size not passed on")
mutant("causal_self_attention_forward", "RoPE applied to the queries only",
       "            k, _ = rope_forward(k, *rope)  # (B, Hkv, T, Dh), the same angles\n", "",
       "check-grouped-query-attention", hint="with RoPE turning the queries only")
mutant("causal_self_attention_forward", "RoPE applied to the values too",
       "            k, _ = rope_forward(k, *rope)  # (B, Hkv, T, Dh), the same angles\n",
       "            k, _ = rope_forward(k, *rope)  # (B, Hkv, T, Dh), the same angles\n"
       "            v, _ = rope_forward(v, *rope)\n", "check-grouped-query-attention")
mutant("causal_self_attention_backward", "the values' shared heads not summed back",
       "            dv = repeat_kv_backward(dv, n_rep)  # (B, Hkv, T, Dh)\n", "",
       "check-grouped-query-attention")
mutant("causal_self_attention_backward", "the keys' RoPE backward forgotten",
       "dq, dk = rope_backward(dq, c_rope), rope_backward(dk, c_rope)",
       "dq = rope_backward(dq, c_rope)", "check-grouped-query-attention",
       hint="without RoPE's backward for the keys")
mutant("norm_forward", "eps ignored: 1e-5 written in for the layer norm",
       "params.get(\"beta\"), eps)", "params.get(\"beta\"), 1e-5)", "check-gpt-block")
mutant("gpt_block_forward", "dropout drawn without an rng (train not passed)",
       "dropout_forward(out, c.dropout, rng, train=rng is not None)",
       "dropout_forward(out, c.dropout, rng)", "check-gpt-block",
       hint="rng = None: without an rng a model evaluates")
mutant("gpt_block_forward", "config.eps not passed to the first norm (1e-5 written in)",
       "params[\"norm1\"], True, c.eps, norm)", "params[\"norm1\"], True, 1e-5, norm)",
       "check-gpt-block")
mutant("gpt_block_forward", "config.attention_block_size not passed on: naive attention always",
       "rope, c.attention_block_size)", "rope, None)", "check-gpt-tiled-attention",
       hint="must pass config.attention_block_size on")
mutant("gpt_forward", "config.eps not passed to the final norm",
       "norm_forward(x, params[\"norm\"], config.norm, config.eps)",
       "norm_forward(x, params[\"norm\"], config.norm)", "check-gpt-model")
mutant("norm_forward", "kind ignored (always layer norm)", "if kind == \"rms\":", "if False:",
       "check-modern-block")
mutant("norm_forward", "kind ignored in the forward only: layer norm's cache reaches "
       "rms_norm_backward", "if kind == \"rms\":", "if False:", "check-gpt-rms-norm",
       hint="is norm_forward extended to kind 'rms' too")
mutant("norm_backward", "kind ignored (always layer norm)", "if kind == \"rms\":", "if False:",
       "check-modern-block")
mutant("mlp_forward", "not extended: SwiGLU's parameters given to the plain network",
       "    if kind == \"swiglu\":\n        out, cache = swiglu_forward(x, params)\n    else:\n"
       "        out, cache = feed_forward_forward(x, params, kind)\n",
       "    out, cache = feed_forward_forward(x, params, kind)\n", "check-swiglu",
       hint="is it extended to kind 'swiglu'")
mutant("mlp_forward", "kind not passed on (always ReLU)",
       "feed_forward_forward(x, params, kind)", "feed_forward_forward(x, params)",
       "check-gpt-block")
mutant("mlp_forward", "GPT-2's tanh GELU written in, the kind ignored",
       "feed_forward_forward(x, params, kind)", "feed_forward_forward(x, params, \"gelu_tanh\")",
       "check-gpt-block")
mutant("mlp_backward", "kind ignored (always the plain network)", "if kind == \"swiglu\":",
       "if False:", "check-modern-block")
mutant("gpt_block_forward", "the first norm's parameters used before the MLP too",
       "residual_forward(x, dropped(mlp), params[\"norm2\"]",
       "residual_forward(x, dropped(mlp), params[\"norm1\"]", "check-gpt-block")
mutant("gpt_block_forward", "post-norm sublayers in a pre-norm block",
       "residual_forward(x, dropped(attend), params[\"norm1\"], True",
       "residual_forward(x, dropped(attend), params[\"norm1\"], False",
       "check-gpt-block")
mutant("gpt_block_forward", "dropout forgotten: the rng never used",
       "out, c_drop = dropout_forward(out, c.dropout, rng, train=rng is not None)",
       "c_drop = None", "check-gpt-dropout")
mutant("gpt_block_forward", "dropout in evaluation too (train=True whatever rng is)",
       "train=rng is not None)", "train=True)", "check-gpt-model")
mutant("gpt_block_backward", "dropout's backward forgotten: the gradient passes unmasked",
       "sublayer_backward(dropout_backward(dout, c_drop), inner)",
       "sublayer_backward(dout, inner)", "check-gpt-dropout")
mutant("gpt_block_backward", "the block's norm's backward not passed on (a layer norm's used)",
       "residual_backward(dout, c_mlp, dropped(mlp_backward), norm_backward)",
       "residual_backward(dout, c_mlp, dropped(mlp_backward))", "check-modern-block")
mutant("gpt_forward", "the generator not passed to the blocks: no dropout in training",
       "gpt_block_forward(x, layer, config, rope, rng)",
       "gpt_block_forward(x, layer, config, rope)", "check-gpt-dropout")
mutant("gpt_loss", "the generator not passed on: no dropout in training",
       "gpt_forward(params, ids, config, pe, rope, rng)",
       "gpt_forward(params, ids, config, pe, rope)", "check-gpt-dropout")
mutant("gpt_forward", "learned positions ignored",
       "positions = params[\"pos\"][\"W\"] if \"pos\" in params else pe", "positions = pe",
       "check-gpt-model")
mutant("gpt_forward", "a fixed positional table pe ignored (only learned positions added)",
       "positions = params[\"pos\"][\"W\"] if \"pos\" in params else pe",
       "positions = params[\"pos\"][\"W\"] if \"pos\" in params else None", "check-gpt-model")
mutant("gpt_backward", "the layers' gradients appended in the backward's order",
       "g_layers.insert(0, g)", "g_layers.append(g)", "check-gpt-model",
       hint="with the layers' gradients in reverse order")
mutant("gpt_backward", "the output projection's share of the tied table's gradient forgotten",
       "        d_table += g_out[\"W\"]  # tied: the two uses of the table add up\n",
       "        pass\n", "check-gpt-model")
mutant("gpt_forward", "an untied model's output table ignored: the embeddings project instead",
       "W_out = params.get(\"lm_head\", params[\"embed\"])[\"W\"]",
       "W_out = params[\"embed\"][\"W\"]", "check-gpt-model")
mutant("gpt_backward", "an untied head's gradient added to the embedding table's (as if tied)",
       "if untied:", "if False:", "check-gpt-model")
mutant("gpt_loss", "the loss itself passed back as dloss",
       "next_token_loss_backward(1.0, c_loss)", "next_token_loss_backward(loss, c_loss)",
       "check-gpt-model")
mutant("kv_cache_append", "each piece written one slot late (at length + 1)",
       "    K[:, :, length:end] = k\n    V[:, :, length:end] = v\n",
       "    K[:, :, length + 1:end + 1] = k\n    V[:, :, length + 1:end + 1] = v\n",
       "check-kv-cache-append", hint="one slot late")
mutant("kv_cache_append", "the keys written into V and the values into K",
       "    K[:, :, length:end] = k\n    V[:, :, length:end] = v\n",
       "    K[:, :, length:end] = v\n    V[:, :, length:end] = k\n",
       "check-kv-cache-append", hint="the keys and the values swapped")
mutant("kv_cache_append", "the new positions written along the heads' axis",
       "    K[:, :, length:end] = k\n    V[:, :, length:end] = v\n",
       "    K[:, length:end] = k\n    V[:, length:end] = v\n",
       "check-kv-cache-append", hint="does the slice cut the axis it means to")
mutant("kv_cache_append", "the whole cache returned, unfilled positions included",
       "return K[:, :, :end], V[:, :, :end], end", "return K, V, end", "check-kv-cache-append")
mutant("causal_self_attention_step", "the step not extended for RoPE: the new queries and keys "
       "not rotated", "        if rope is not None:\n            q, _ = rope_forward(q, *rope)\n"
       "            k, _ = rope_forward(k, *rope)\n", "", "check-grouped-query-attention",
       hint="not turning its new queries and keys")
mutant("causal_self_attention_step", "the RoPE tables' rows sliced again by position, though "
       "they are the new positions' already",
       "            q, _ = rope_forward(q, *rope)\n            k, _ = rope_forward(k, *rope)\n",
       "            rows = slice(length, length + q.shape[2])\n"
       "            q, _ = rope_forward(q, rope[0][rows], rope[1][rows])\n"
       "            k, _ = rope_forward(k, rope[0][rows], rope[1][rows])\n",
       "check-grouped-query-attention", hint="has no entries along an axis")
mutant("causal_self_attention_step", "the new keys appended to the cache before RoPE turns them",
       "            k, _ = rope_forward(k, *rope)\n"
       "        keys, values, end = kv_cache_append(K, V, length, k, v)  # (B, Hkv, end, Dh)\n",
       "        keys, values, end = kv_cache_append(K, V, length, k, v)  # (B, Hkv, end, Dh)\n"
       "        if rope is not None:\n            k, _ = rope_forward(k, *rope)\n",
       "check-grouped-query-attention", hint="before RoPE turns them")
mutant("causal_self_attention_step", "the step not extended for shared key/value heads",
       "        if n_rep > 1:  # shared key/value heads (notebook 15 §4)\n"
       "            keys, _ = repeat_kv_forward(keys, n_rep)  # (B, H, end, Dh)\n"
       "            values, _ = repeat_kv_forward(values, n_rep)\n", "",
       "check-grouped-query-attention")
mutant("causal_self_attention_step", "the new positions' mask not offset by length",
       "mask = causal_mask(end)[length:]", "mask = causal_mask(q.shape[2], end)",
       "check-gpt-step", hint="causal_mask(end)[:t]")
mutant("causal_self_attention_step", "no mask in the cached step: a step of several tokens sees "
       "its later ones", "attention_forward(q, keys, values, mask)",
       "attention_forward(q, keys, values, None)", "check-gpt-step", hint="without the mask")
mutant("gpt_block_step", "the attention's residual connection forgotten",
       "x, _ = residual_forward(x, attend, params[\"norm1\"], True, c.eps, norm)",
       "x, _ = attend(norm(x, params[\"norm1\"], c.eps)[0])", "check-gpt-step")
mutant("gpt_step", "an untied model's output table ignored in the cached step",
       "params.get(\"lm_head\", params[\"embed\"])[\"W\"]", "params[\"embed\"][\"W\"]",
       "check-gpt-step")
mutant("gpt_forward", "RoPE's tables not passed to the blocks",
       "gpt_block_forward(x, layer, config, rope, rng)",
       "gpt_block_forward(x, layer, config, None, rng)", "check-modern-gpt")
mutant("gpt_loss", "RoPE's tables not passed on", "gpt_forward(params, ids, config, pe, rope, rng)",
       "gpt_forward(params, ids, config, pe, None, rng)", "check-modern-gpt")
mutant("gpt_step", "RoPE's tables not passed to the blocks in the cached step",
       "gpt_block_step(x, layer, c, K, V, length, rope)",
       "gpt_block_step(x, layer, c, K, V, length, None)", "check-modern-gpt")
mutant("gpt_block_step", "RoPE's tables not passed to the cached attention", "length, rope)",
       "length, None)", "check-modern-gpt")
mutant("gpt_step", "a fixed positional table pe ignored in the cached step",
       "positions = params[\"pos\"][\"W\"] if \"pos\" in params else pe",
       "positions = params[\"pos\"][\"W\"] if \"pos\" in params else None", "check-gpt-step")
mutant("gpt_step", "the positions' rows not offset by length",
       "        positions = positions[length:]  # the rows of the new positions\n",
       "        pass\n", "check-gpt-step", hint="from row 0 of the table")
mutant("gpt_step", "the length advanced by every layer, not once a step",
       "x, end = gpt_block_step(x, layer, c, K, V, length, rope)",
       "x, length = gpt_block_step(x, layer, c, K, V, length, rope)\n        end = length",
       "check-gpt-step", hint="not once a layer")
mutant("gpt_step", "the cached step's logits turned float64",
       "logits, _ = tied_output_forward(x, params.get(\"lm_head\", params[\"embed\"])[\"W\"])",
       "logits, _ = tied_output_forward(x, params.get(\"lm_head\", params[\"embed\"])[\"W\"])"
       "\n    logits = logits.astype(np.float64)", "check-gpt-step",
       hint="came back as float64")
mutant("gpt_step", "the final norm forgotten in the cached step",
       "    x, _ = norm_forward(x, params[\"norm\"], c.norm, c.eps)\n", "", "check-gpt-step",
       hint="without the final norm")
mutant("gpt_step", "one cache for every layer (the first layer's)",
       "for layer, (K, V) in zip(params[\"layers\"], kv_caches, strict=True):",
       "K, V = kv_caches[0]\n    for layer in params[\"layers\"]:", "check-gpt-step",
       hint="with one cache for every layer")
mutant("gpt_block_step", "post-norm residuals in the cached step (norm_first False)",
       "params[\"norm1\"], True, c.eps, norm)  # (B, t, E)\n    out, _ = residual_forward(x, "
       "mlp, params[\"norm2\"], True,", "params[\"norm1\"], False, c.eps, norm)  # (B, t, E)\n"
       "    out, _ = residual_forward(x, mlp, params[\"norm2\"], False,", "check-gpt-step",
       hint="with post-norm residuals")
mutant("causal_self_attention_step", "the cache written but not read: the new positions attend "
       "to each other only",
       "keys, values, end = kv_cache_append(K, V, length, k, v)  # (B, Hkv, end, Dh)\n"
       "        if n_rep > 1:  # shared key/value heads (notebook 15 §4)\n"
       "            keys, _ = repeat_kv_forward(keys, n_rep)  # (B, H, end, Dh)\n"
       "            values, _ = repeat_kv_forward(values, n_rep)\n"
       "        mask = causal_mask(end)[length:]",
       "_, _, end = kv_cache_append(K, V, length, k, v)\n        keys, values = k, v\n"
       "        mask = causal_mask(q.shape[2])",
       "check-gpt-step", hint="attending to each other only")
mutant("sample_next", "one uniform for the whole batch",
       "    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]  # below the total, whatever "
       "rounding\n", "    u = rng.random() * cdf[:, -1:]\n", "check-sample-next",
       hint="one uniform for the whole batch")
mutant("sample_next", "no greedy branch: temperature 0 divides by zero",
       "    if temperature == 0:\n        return np.argmax(logits, axis=-1)\n", "",
       "check-sample-next", hint="with no greedy branch")
mutant("sample_next", "the logits divided in place: the caller's logits change",
       "    z = logits / temperature\n", "    logits /= temperature\n    z = logits\n",
       "check-sample-next", hint="not divided in place")
mutant("sample_next", "the tokens as floats", "return (cdf <= u).sum(axis=-1)",
       "return (cdf <= u).sum(axis=-1) * 1.0", "check-sample-next")
mutant("sample_next", "the tokens kept as a (B, 1) column", "return (cdf <= u).sum(axis=-1)",
       "return (cdf <= u).sum(axis=-1, keepdims=True)", "check-sample-next")
mutant("top_k_filter", "the k-th largest read as np.sort(logits)[..., k]",
       "kth = np.partition(logits, -k, axis=-1)[..., -k:-k + 1 or None]",
       "kth = np.sort(logits, axis=-1)[..., k:k + 1]", "check-top-k-filter",
       hint="np.sort(logits)[..., k]")
mutant("top_k_filter", "the cut logits set to 0 instead of -inf",
       "return np.where(logits < kth, -np.inf, logits)",
       "return np.where(logits < kth, 0.0, logits)", "check-top-k-filter",
       hint="the cut logits are -inf")
mutant("top_k_filter", "the cut logits set to NaN",
       "return np.where(logits < kth, -np.inf, logits)",
       "return np.where(logits < kth, np.nan, logits)", "check-top-k-filter",
       hint="the cut logits are -inf")
mutant("top_k_filter", "exactly k kept (an argsort's last k): ties with the k-th dropped",
       "return np.where(logits < kth, -np.inf, logits)",
       "top = np.argsort(logits, axis=-1)[..., -k:]\n"
       "    out = np.full_like(logits, -np.inf)\n"
       "    np.put_along_axis(out, top, np.take_along_axis(logits, top, -1), -1)\n"
       "    return out", "check-top-k-filter")
mutant("top_k_filter", "the k-th largest filtered out too (<=)", "np.where(logits < kth",
       "np.where(logits <= kth", "check-top-k-filter")
mutant("top_p_filter", "a token kept when the mass above it equals p (<= for <)",
       "keep = np.take_along_axis(above < p, rank, axis=-1)",
       "keep = np.take_along_axis(above <= p, rank, axis=-1)", "check-top-p-filter")
mutant("top_p_filter", "ties ranked by the higher id first (a descending sort, reversed)",
       'order = np.argsort(-logits, axis=-1, kind="stable")',
       'order = np.argsort(logits, axis=-1, kind="stable")[..., ::-1]', "check-top-p-filter")
mutant("top_p_filter", "NumPy's default sort, not a stable one (ties in any order)",
       'order = np.argsort(-logits, axis=-1, kind="stable")',
       "order = np.argsort(-logits, axis=-1)", "check-top-p-filter",
       hint="a sort that is not stable")
mutant("top_p_filter", "the decisions taken back through order itself, not its inverse",
       "keep = np.take_along_axis(above < p, rank, axis=-1)",
       "keep = np.take_along_axis(above < p, order, axis=-1)", "check-top-p-filter",
       hint="taking the decisions back with take_along_axis(kept_sorted, order)")
mutant("top_p_filter", "no sort: the mass summed in the vocabulary's order",
       'order = np.argsort(-logits, axis=-1, kind="stable")',
       "order = np.broadcast_to(np.arange(logits.shape[-1]), logits.shape)",
       "check-top-p-filter", hint="the mass summed in the vocabulary's order")
mutant("top_p_filter", "a softmax without the maximum subtracted (exp overflows)",
       "probs, _ = softmax_forward(logits)",
       "probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)",
       "check-top-p-filter", hint="does not subtract the row's maximum")
mutant("top_p_filter", "the token that crosses p dropped (its own probability counted)",
       "above = np.cumsum(sorted_probs, axis=-1) - sorted_probs",
       "above = np.cumsum(sorted_probs, axis=-1)", "check-top-p-filter")
mutant("sample_next", "temperature ignored", "z = logits / temperature", "z = logits",
       "check-sample-next")
mutant("sample_next", "top_k ignored (no top-k filter)", "        z = top_k_filter(z, top_k)\n",
       "        pass\n", "check-sample-next")
mutant("sample_next", "the filters in the other order (top-p before top-k)",
       "    if top_k is not None:\n        z = top_k_filter(z, top_k)\n    if top_p is not None:\n"
       "        z = top_p_filter(z, top_p)\n",
       "    if top_p is not None:\n        z = top_p_filter(z, top_p)\n    if top_k is not None:\n"
       "        z = top_k_filter(z, top_k)\n", "check-sample-next")
MINP = "14_decoding/exercise-min-p-filter"
mutant(MINP, "the kept probabilities returned, not the logits",
       "    return np.where(keep, logits, -np.inf)\n", "    return np.where(keep, probs, 0.0)\n",
       "check-min-p-filter", hint="probabilities? A filter returns logits")
mutant(MINP, "p_min as an absolute threshold", "probs >= p_min * probs.max(axis=-1, keepdims=True)",
       "probs >= p_min", "check-min-p-filter")
mutant(MINP, "the logits compared, not the probabilities",
       "probs >= p_min * probs.max(axis=-1, keepdims=True)",
       "logits >= p_min * logits.max(axis=-1, keepdims=True)", "check-min-p-filter",
       hint="comparing the logits")
mutant(MINP, "the largest probability of the whole batch", "probs.max(axis=-1, keepdims=True)",
       "probs.max()", "check-min-p-filter", hint="of the whole batch")


# ============================================================================================
# 16_long_context

mutant("online_softmax_update", "m_new the block's maximum alone (the running one ignored)",
       "m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))",
       "m_new = scores.max(axis=-1, keepdims=True)", "check-online-softmax-update",
       hint="the block's maximum alone")
mutant("online_softmax_update", "the old sum not rescaled", "ell_new = alpha * ell +",
       "ell_new = ell +", "check-online-softmax-update")
mutant("online_softmax_update", "no guard for a row of -inf only",
       "shift = np.where(np.isneginf(m_new), 0, m_new)", "shift = m_new",
       "check-online-softmax-update", hint="-inf - (-inf)")
mutant("flash_attention_forward", "the future tiles visited, unmasked (only the diagonal masked)",
       "stop = min(S, i + block_size) if causal else S", "stop = S",
       "check-flash-forward", hint="visiting the future tiles too")
mutant("flash_attention_forward", "the diagonal tile masked by a full block's mask, also on "
       "a shorter last tile", "causal_mask(*s.shape[-2:])", "causal_mask(block_size, block_size)",
       "check-flash-forward", hint="a full block's mask on a shorter last tile")
mutant("flash_attention_forward", "the causal range of keys not clipped to S (T > S)",
       "stop = min(S, i + block_size) if causal else S", "stop = i + block_size if causal else S",
       "check-flash-forward", hint="past the keys' end not clipped")
mutant("online_softmax_update", "np.max(m, ...) where np.maximum belongs",
       "m_new = np.maximum(m, scores.max(axis=-1, keepdims=True))",
       "m_new = np.max(m, scores.max(axis=-1, keepdims=True))", "check-online-softmax-update",
       hint="the elementwise maximum of two arrays is np.maximum(a, b)")
mutant("flash_attention_forward", "lse = log(ell), the running maximum forgotten",
       "lse[..., i:i + block_size] = (m + np.log(ell))[..., 0]",
       "lse[..., i:i + block_size] = np.log(ell)[..., 0]", "check-flash-forward",
       hint="m forgotten")
mutant("flash_attention_forward", "the accumulator not rescaled", "            acc *= alpha\n",
       "", "check-flash-forward")
mutant("flash_attention_forward", "the running maximum started at 0, not -inf",
       "m = np.full(q_i.shape[:-1] + (1,), -np.inf, dtype=q.dtype)",
       "m = np.zeros(q_i.shape[:-1] + (1,), dtype=q.dtype)", "check-flash-forward")
mutant("flash_attention_forward", "the diagonal tile not masked",
       "np.copyto(s, -np.inf, where=causal_mask(*s.shape[-2:]))", "pass", "check-flash-forward")
mutant("flash_attention_forward", "the diagonal tile skipped: keys up to the block's start",
       "stop = min(S, i + block_size) if causal else S  # later keys",
       "stop = min(S, i) if causal else S  # later keys", "check-flash-forward")
mutant("flash_attention_backward_tile", "the mask left out of the tile's weights",
       "    if mask is not None:\n        np.copyto(p, -np.inf, where=mask)\n", "",
       "check-flash-backward-tile", hint="the tile's mask left out")
mutant("flash_attention_backward_tile", "dv_j transposed (dout_i^T P)",
       "dv_j = np.swapaxes(p, -1, -2) @ dout_i", "dv_j = np.swapaxes(dout_i, -1, -2) @ p",
       "check-flash-backward-tile", hint="dv_j of the tile of keys")
mutant("flash_attention_backward_tile", "the scale forgotten in dk",
       "dk_j = np.swapaxes(dz, -1, -2) @ qs", "dk_j = np.swapaxes(dz, -1, -2) @ q_i",
       "check-flash-backward-tile")
mutant("flash_attention_backward_tile", "D scaled by the scale in the tile",
       "dz -= D_i[..., None]", "dz -= D_i[..., None] * scale", "check-flash-backward-tile",
       hint="with D scaled")
mutant("flash_attention_backward", "D forgotten (zeros): dZ = P * dP",
       'D = np.einsum("...d,...d->...", dout, out)', "D = np.zeros(dout.shape[:-1])",
       "check-flash-backward")
mutant("flash_attention_backward", "D as rowsum(dO), the output forgotten",
       'D = np.einsum("...d,...d->...", dout, out)', "D = dout.sum(-1)",
       "check-flash-backward")
mutant("flash_attention_backward", "D scaled by 1 / sqrt(d)",
       'D = np.einsum("...d,...d->...", dout, out)',
       'D = np.einsum("...d,...d->...", dout, out) * scale', "check-flash-backward",
       hint="with D scaled by 1 / sqrt(d)")
mutant("flash_attention_backward", "dk and dv given each tile's part with = instead of +=",
       "            dk[..., cols, :] += dk_ij\n            dv[..., cols, :] += dv_ij\n",
       "            dk[..., cols, :] = dk_ij\n            dv[..., cols, :] = dv_ij\n",
       "check-flash-backward")
mutant("flash_attention_backward", "dq given each tile's part with = instead of +=",
       "dq[..., rows, :] += dq_ij", "dq[..., rows, :] = dq_ij", "check-flash-backward")
mutant("flash_attention_backward", "the future tiles visited (causal)",
       "        stop = min(S, i + block_size) if causal else S\n", "        stop = S\n",
       "check-flash-backward")
mutant("flash_self_attention_forward", "causal not passed on",
       "flash_attention_forward(q, k, v, causal, block_size)",
       "flash_attention_forward(q, k, v, False, block_size)", "check-flash-self-attention")
mutant("flash_self_attention_forward", "always causal (the argument causal ignored)",
       "flash_attention_forward(q, k, v, causal, block_size)",
       "flash_attention_forward(q, k, v, True, block_size)", "check-flash-self-attention")
mutant("flash_self_attention_forward", "block_size ignored: one tile of the whole (T, T)",
       "return flash_attention_forward(q, k, v, causal, block_size)",
       "return flash_attention_forward(q, k, v, causal, q.shape[-2])",
       "check-flash-self-attention", hint="in tiles of block_size")
mutant("flash_self_attention_forward", "block_size ignored: the default block size",
       "return flash_attention_forward(q, k, v, causal, block_size)",
       "return flash_attention_forward(q, k, v, causal)", "check-flash-self-attention",
       hint="with block_size not passed on")
mutant("flash_self_attention_backward", "the naive backward for the tiled forward",
       "self_attention_backward(dout, cache, attend_backward=flash_attention_backward)",
       "self_attention_backward(dout, cache)", "check-flash-self-attention")


# ============================================================================================
# 11_tokenization

mutant("bytes_to_unicode", "every byte keeps its own character (the space, the newline and the "
       "control bytes are not printable)", "mapping[b] = chr(256 + extra)",
       "mapping[b] = chr(b)", "check-bytes-to-unicode")
mutant("bytes_to_unicode", "the stand-ins counted from chr(255)", "chr(256 + extra)",
       "chr(255 + extra)", "check-bytes-to-unicode")
mutant("bytes_to_unicode", "the Latin-1 range ¡..¬ forgotten among the printable bytes",
       ' *range(ord("¡"), ord("¬") + 1),', "", "check-bytes-to-unicode")
mutant("bytes_to_unicode", "the soft hyphen, byte 173, taken as printable",
       '*range(ord("®"), ord("ÿ") + 1)', '*range(ord("®") - 1, ord("ÿ") + 1)',
       "check-bytes-to-unicode")
mutant("pretokenize", "the space prefix forgotten (' ?' dropped before letters)",
       r"| ?\p{L}+|", r"|\p{L}+|", "check-pretokenize")
mutant("pretokenize", "a run of spaces takes the space of the next word (no lookahead)",
       r"|\s+(?!\S)|\s+", r"|\s+", "check-pretokenize")
mutant("pretokenize", "the two runs of spaces in the other order (\\s+ first: it takes all)",
       r"|\s+(?!\S)|\s+", r"|\s+|\s+(?!\S)", "check-pretokenize", hint="or with it after \\s+")
mutant("pretokenize", "the contractions left out", "'s|'t|'re|'ve|'m|'ll|'d| ?", " ?",
       "check-pretokenize", hint="without any contractions")
mutant("pretokenize", "'re and 'd left out of the contractions",
       "'s|'t|'re|'ve|'m|'ll|'d| ?", "'s|'t|'ve|'m|'ll| ?", "check-pretokenize",
       hint="without all seven contractions")
mutant("pretokenize", r"\d for \p{N}: ², ½ not numbers (x²+1 cut unlike GPT-2)",
       r"| ?\p{N}+| ?[^\s\p{L}\p{N}]+|", r"| ?\d+| ?[^\s\p{L}\d]+|", "check-pretokenize")
mutant("pretokenize", r"[^\W\d_] for \p{L}: marks taken as letters (Devanagari words kept whole)",
       r"| ?\p{L}+|", r"| ?[^\W\d_]+|", "check-pretokenize")
mutant("pretokenize", "the contractions matched in any case (DON'T cut as DON, 'T)",
       '"""\'s|\'t|\'re|\'ve|\'m|\'ll|\'d|', '"""(?i:\'s|\'t|\'re|\'ve|\'m|\'ll|\'d)|',
       "check-pretokenize")
mutant("word_counts", "the characters' code points instead of the UTF-8 bytes",
       'tuple(piece.encode("utf-8"))', "tuple(map(ord, piece))", "check-word-counts")
mutant("word_counts", "the pieces themselves as keys (str), not their bytes",
       'tuple(piece.encode("utf-8"))', "piece", "check-word-counts",
       hint="each key is a piece's UTF-8 bytes as a tuple of ints")
mutant("word_counts", "no pre-tokenization: the whole text one word (pairs across pieces)",
       "for piece in pretokenize(text)", "for piece in [text]", "check-word-counts")
mutant("pair_counts", "each pair counted once per word, not weighted by its count",
       "counts[pair] += count", "counts[pair] += 1", "check-pair-counts")
mutant("pair_counts", "pairs counted across two words (the previous word's last id kept)",
       "    for word, count in words.items():\n        for pair in itertools.pairwise(word):",
       "    last = ()\n    for word, count in words.items():\n"
       "        word, last = last + tuple(word), tuple(word[-1:])\n"
       "        for pair in itertools.pairwise(word):", "check-pair-counts")
mutant("merge_pair", "'aaa' merged as overlapping pairs (moving on by one after a merge)",
       "            out.append(new_id)\n            i += 2", "            out.append(new_id)\n"
       "            i += 1", "check-merge-pair")
mutant("merge_pair", "the last id dropped", "while i < len(word):", "while i < len(word) - 1:",
       "check-merge-pair", hint="dropping the last id")
mutant("merge_pair", "merged from the right",
       "    out, i = [], 0\n    while i < len(word):\n"
       "        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:\n"
       "            out.append(new_id)\n            i += 2\n        else:\n"
       "            out.append(word[i])\n            i += 1\n    return tuple(out)\n",
       "    out, i = [], len(word) - 1\n    while i >= 0:\n"
       "        if i > 0 and (word[i - 1], word[i]) == pair:\n"
       "            out.append(new_id)\n            i -= 2\n        else:\n"
       "            out.append(word[i])\n            i -= 1\n    return tuple(out[::-1])\n",
       "check-merge-pair", hint="merging from the right")
mutant("merge_pair", "the first occurrence only",
       "            out.append(new_id)\n            i += 2",
       "            return (*out, new_id, *word[i + 2:])", "check-merge-pair",
       hint="merging the first occurrence only")
mutant("pair_counts", "a pair counted once in a word (a set of its pairs)",
       "for pair in itertools.pairwise(word):", "for pair in set(itertools.pairwise(word)):",
       "check-pair-counts", hint="however often it occurs there")
mutant("pair_counts", "each id paired with the one two places on",
       "for pair in itertools.pairwise(word):", "for pair in zip(word, word[2:]):",
       "check-pair-counts", hint="two places on")
mutant("train_bpe", "the new ids from 257", "for new_id in range(256, 256 + num_merges):",
       "for new_id in range(257, 257 + num_merges):", "check-train-bpe",
       hint="the new ids from 257")
mutant("merge_pair", "a list returned (a word is a tuple, a dict key)", "    return tuple(out)",
       "    return out", "check-merge-pair")
mutant("train_bpe", "a tie broken by the larger pair",
       "best = min(pair for pair, count", "best = max(pair for pair, count", "check-train-bpe")
mutant("train_bpe", "a tie broken by the pair counted first (max with key=counts.get)",
       "        top = max(counts.values())\n"
       "        best = min(pair for pair, count in counts.items() if count == top)\n",
       "        best = max(counts, key=counts.get)\n", "check-train-bpe")
mutant("train_bpe", "the counts never updated (ranked once, before any merge)",
       "        for i in sorted(where.pop(best)):", "        del counts[best]\n"
       "        for i in ():", "check-train-bpe")
mutant("train_bpe", "the merged word's new pairs not added back",
       "                counts[pair] = counts.get(pair, 0) + n\n",
       "                counts.setdefault(pair, 0)\n", "check-train-bpe")
mutant("train_bpe", "every pair recounted after every merge (the right merges, no update)",
       "        merges.append(best)\n        for i in sorted(where.pop(best)):",
       "        merges.append(best)\n"
       "        words = [(merge_pair(word, best, new_id), count) for word, count in words]\n"
       "        counts = pair_counts(dict(words))\n"
       "        for i in ():", "check-train-bpe")
mutant("train_bpe", "every pair recounted inline after every merge (no pair_counts call)",
       "        merges.append(best)\n        for i in sorted(where.pop(best)):",
       "        merges.append(best)\n"
       "        words = [(merge_pair(word, best, new_id), count) for word, count in words]\n"
       "        counts = {}\n"
       "        for word, count in words:\n"
       "            for pair in zip(word, word[1:]):\n"
       "                counts[pair] = counts.get(pair, 0) + count\n"
       "        for i in ():", "check-train-bpe")
mutant("train_bpe", "the caller's words changed (worked on in place, emptied at the end)",
       "    words = [(tuple(word), count) for word, count in words.items()]",
       "    given, words = words, [(tuple(word), count) for word, count in words.items()]\n"
       "    given.clear()", "check-train-bpe")
mutant("train_bpe", "pairs with a count of 0 kept (training does not stop when none is left)",
       "                if counts[pair] == 0:\n                    del counts[pair]\n", "",
       "check-train-bpe")
mutant("token_bytes", "bytes(b) for a byte (b zero bytes)", "vocab = [bytes([b]) for b",
       "vocab = [bytes(b) for b", "check-token-bytes")
mutant("token_bytes", "a merge's bytes in the wrong order", "vocab.append(vocab[a] + vocab[b])",
       "vocab.append(vocab[b] + vocab[a])", "check-token-bytes", hint="in the other order")
mutant("encode_word", "rank 0 for the pairs never learned (ranks.get(p, 0))",
       "key=lambda p: ranks.get(p, math.inf))", "key=lambda p: ranks.get(p, 0))",
       "check-encode-word", hint="with rank 0 for the pairs never learned")
mutant("bpe_decode", "decoded as Latin-1", '.decode("utf-8", errors="replace")',
       '.decode("latin-1")', "check-bpe-decode", hint="decoding as Latin-1")
mutant("bpe_decode", "spelled in GPT-2's stand-in characters",
       'return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")',
       'return "".join(bytes_to_unicode()[b] for b in b"".join(vocab[i] for i in ids))',
       "check-bpe-decode", hint="with GPT-2's stand-in characters")
mutant("encode_word", "the first learned pair found left to right, not the lowest rank",
       "pair = min(itertools.pairwise(word), key=lambda p: ranks.get(p, math.inf))",
       "pair = next((p for p in itertools.pairwise(word) if p in ranks), word[:2])",
       "check-encode-word")
mutant("encode_word", "the latest merge first (the highest rank)",
       "pair = min(itertools.pairwise(word), key=lambda p: ranks.get(p, math.inf))",
       "pair = max(itertools.pairwise(word), key=lambda p: ranks.get(p, -1))",
       "check-encode-word")
mutant("encode_word", "the rank as the new id (256 forgotten)", "256 + ranks[pair]",
       "ranks[pair]", "check-encode-word")
mutant("encode_word", "no stop when no pair of the word was learned (ranks[pair] of any pair)",
       "        if pair not in ranks:\n            break\n", "", "check-encode-word",
       hint="a pair that was never learned has no rank")
mutant("bpe_encode", "the whole text encoded as one word", "for piece in pretokenize(text):",
       "for piece in [text] if text else []:", "check-bpe-encode")
mutant("bpe_encode", "the pieces' code points instead of their UTF-8 bytes",
       'encode_word(piece.encode("utf-8"), ranks)', "encode_word(map(ord, piece), ranks)",
       "check-bpe-encode")
mutant("bpe_decode", "each token decoded on its own (a character cut in two shows twice)",
       'return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")',
       'return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)',
       "check-bpe-decode")
mutant("bpe_decode", "errors='ignore': a cut character vanishes", 'errors="replace"',
       'errors="ignore"', "check-bpe-decode")
mutant("bpe_decode", "decoded strictly: a character cut in two raises",
       '.decode("utf-8", errors="replace")', '.decode("utf-8")', "check-bpe-decode",
       hint='decode with errors="replace"')
mutant("bpe_decode", "the ids taken as bytes (bytes(ids)): merged tokens are 256 and up",
       'b"".join(vocab[i] for i in ids)', "bytes(ids)", "check-bpe-decode",
       hint="an id of 256 or more is a merged token")


# ============================================================================================
# 12_translation


mutant("label_smoothed_loss_forward", "the smoothing term counted at the ignored positions",
       "loss = float((((1 - eps) * nll + eps * uniform) * keep).sum() * weight)",
       "loss = float((((1 - eps) * nll * keep + eps * uniform)).sum() * weight)",
       "check-label-smoothed-loss", hint="the smoothing term counted at the ignored positions")
mutant("label_smoothed_loss_forward", "the target's term without its 1 - eps",
       "loss = float((((1 - eps) * nll + eps * uniform) * keep).sum() * weight)",
       "loss = float(((nll + eps * uniform) * keep).sum() * weight)",
       "check-label-smoothed-loss", hint="the target's weight 1 where 1 - eps belongs")
mutant("label_smoothed_loss_forward", "padding taken to be the negative ids (ignore_index unused)",
       "keep = targets != ignore_index  # (...)", "keep = targets >= 0  # (...)",
       "check-label-smoothed-loss")
mutant("label_smoothed_loss_forward", "eps spread over the V - 1 other classes (torch: over all V)",
       "uniform = -logp.mean(axis=-1)",
       "uniform = -(logp.sum(axis=-1) - nll * -1) / (logp.shape[-1] - 1)",
       "check-label-smoothed-loss")
mutant("label_smoothed_loss_forward", "the log of the softmax (-inf where it underflows to 0)",
       "    logp, c_logp = log_softmax_forward(logits)  # (..., V)\n",
       "    e = np.exp(logits - logits.max(axis=-1, keepdims=True))\n"
       "    logp = np.log(e / e.sum(axis=-1, keepdims=True))  # (..., V)\n"
       "    c_logp = log_softmax_forward(logits)[1]\n", "check-label-smoothed-loss")
mutant("label_smoothed_loss_forward", "ignore_index forgotten: the mean over every position",
       "weight = 1 / keep.sum()", "keep = np.ones_like(keep)\n    weight = 1 / keep.size",
       "check-label-smoothed-loss")
mutant("label_smoothed_loss_forward", "eps on the target and 1 - eps on the uniform part",
       "loss = float((((1 - eps) * nll + eps * uniform) * keep).sum() * weight)",
       "loss = float(((eps * nll + (1 - eps) * uniform) * keep).sum() * weight)",
       "check-label-smoothed-loss")
mutant("label_smoothed_loss_forward", "divided by every position, the ignored ones too",
       "    weight = 1 / keep.sum()", "    weight = 1 / keep.size", "check-label-smoothed-loss")
mutant("label_smoothed_loss_backward", "the target's eps / V left out of the gradient",
       "    dlogp = np.where(onehot, target, uniform)  # (..., V), the logits' dtype\n",
       "    dlogp = np.where(onehot, (-((1 - eps) * w)[..., None]).astype(c_logp.dtype), "
       "uniform)\n", "check-label-smoothed-loss", hint="the target's eps / V left out")
mutant("label_smoothed_loss_backward", "the ignored positions given a gradient",
       "    w = dloss * weight * keep  # (...)\n", "    w = dloss * weight * np.ones(keep.shape)\n",
       "check-label-smoothed-loss", hint="a gradient at the ignored positions")
mutant("label_smoothed_loss_forward", "the uniform term summed over the classes, not averaged",
       "    uniform = -logp.mean(axis=-1)  # cross-entropy with the uniform distribution, (...)\n",
       "    uniform = -logp.sum(axis=-1)\n", "check-label-smoothed-loss",
       hint="summing -log p over the classes")
mutant("label_smoothed_loss_backward", "the uniform part forgotten in the gradient",
       "uniform = (-w * eps / c_logp.shape[-1])", "uniform = (0 * w)",
       "check-label-smoothed-loss", hint="with the uniform part left out of the gradient")
mutant("label_smoothed_loss_backward", "the target's weight 1 instead of 1 - eps",
       "uniform - ((1 - eps) * w)[..., None]", "uniform - w[..., None]",
       "check-label-smoothed-loss", hint="with the target's weight 1 in the gradient")
mutant("label_smoothed_loss_backward", "dloss forgotten", "w = dloss * weight * keep",
       "w = weight * keep", "check-label-smoothed-loss", hint="ignores dloss")
mutant("length_penalty", "a length one too long: ((6 + length) / 6) ** alpha",
       "return ((5.0 + lengths) / 6.0) ** alpha", "return ((5.0 + lengths + 1) / 6.0) ** alpha",
       "check-beam-step", hint="a length one too long in the penalty")
mutant("length_penalty", "the mean log-probability (lp = |y|) instead of GNMT's",
       "return ((5.0 + lengths) / 6.0) ** alpha", "return lengths ** alpha",
       "check-beam-step", "check-beam-search")
mutant("length_penalty", "the exponent forgotten", "return ((5.0 + lengths) / 6.0) ** alpha",
       "return (5.0 + lengths) / 6.0", "check-beam-step", "check-beam-search")
mutant("length_penalty", "integer division: ((5 + lengths) // 6) ** alpha",
       "return ((5.0 + lengths) / 6.0) ** alpha", "return ((5 + lengths) // 6) ** alpha",
       "check-beam-step", "check-beam-search")
mutant("beam_step", "the parents' finished flags not carried over (EOS alone)",
       "finished = np.take_along_axis(finished, parents, axis=1) | (tokens == eos_id)",
       "finished = tokens == eos_id", "check-beam-step")
mutant("beam_step", "ranked by the mean log-probability (score / length) instead of GNMT's",
       "rank = total / length_penalty(new_lengths, alpha)[..., None]",
       "rank = total / new_lengths[..., None]", "check-beam-step", "check-beam-search")
mutant("beam_step", "ranked by the penalty of the lengths before the step",
       "rank = total / length_penalty(new_lengths, alpha)[..., None]",
       "rank = total / length_penalty(lengths, alpha)[..., None]",
       "check-beam-step", "check-beam-search")
mutant("beam_step", "no length normalisation: ranked by the summed log-probability",
       "rank = total / length_penalty(new_lengths, alpha)[..., None]", "rank = total",
       "check-beam-step", "check-beam-search")
mutant("beam_step", "finished hypotheses dropped from the beam (no continuation kept)",
       "    total[..., pad_id] = np.where(finished, scores, total[..., pad_id])"
       "  # kept, not extended\n", "", "check-beam-step", "check-beam-search")
mutant("beam_step", "finished hypotheses extended after EOS (their candidates not blocked)",
       "total = np.where(finished[..., None], -np.inf, scores[..., None] + logp)",
       "total = scores[..., None] + logp", "check-beam-step", "check-beam-search")
mutant("beam_step", "the candidates not re-sorted: the first K kept",
       'best = np.argsort(-rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]',
       "best = np.broadcast_to(np.arange(K), (B, K))", "check-beam-step", "check-beam-search")
mutant("beam_step", "the worst K kept (sorted ascending)",
       'best = np.argsort(-rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]',
       'best = np.argsort(rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]',
       "check-beam-step", "check-beam-search")
mutant("beam_step", "ties taken last first: an ascending stable argsort, reversed",
       'best = np.argsort(-rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]',
       'best = np.argsort(rank.reshape(B, K * V), axis=1, kind="stable")[:, ::-1][:, :K]',
       "check-beam-step", hint="tied candidates taken last first")
mutant("beam_step", "a Python loop over the sources for the K best",
       'best = np.argsort(-rank.reshape(B, K * V), axis=1, kind="stable")[:, :K]',
       'best = np.stack([np.argsort(-r, kind="stable")[:K] for r in rank.reshape(B, K * V)])',
       "check-beam-step")
mutant("beam_step", "the parent and token of a flat index swapped",
       "parents, tokens = best // V, best % V", "parents, tokens = best % K, best // K",
       "check-beam-step", "check-beam-search")
mutant("beam_step", "the parent of a flat index taken as index // K",
       "parents, tokens = best // V, best % V", "parents, tokens = best // K, best % V",
       "check-beam-step", "check-beam-search", hint="the parent taken as index // K")
mutant("beam_step", "the lengths not gathered by parent",
       "lengths = np.take_along_axis(new_lengths, parents, axis=1)", "lengths = new_lengths",
       "check-beam-step", "check-beam-search")
mutant("beam_step", "every token continues a finished hypothesis at its score",
       "np.where(finished[..., None], -np.inf, scores[..., None] + logp)",
       "np.where(finished[..., None], scores[..., None], scores[..., None] + logp)",
       "check-beam-step", hint="every token continuing a finished hypothesis at its score")
mutant("beam_step", "the finished flags not gathered by parent",
       "finished = np.take_along_axis(finished, parents, axis=1) | (tokens == eos_id)",
       "finished = finished | (tokens == eos_id)", "check-beam-step",
       hint="finished flags not gathered by parent")
mutant("beam_step", "a finished hypothesis grows in length",
       "new_lengths = lengths + ~finished", "new_lengths = lengths + 1",
       "check-beam-step", "check-beam-search")
mutant("beam_search", "K copies of the start: every hypothesis scored 0 at first",
       "    scores[:, 0] = 0.0  # one live hypothesis to start with, not K copies of it\n",
       "    scores[:] = 0.0\n", "check-beam-search")
mutant("beam_search", "parent indices not gathered: the prefixes stay in their rows",
       "np.take_along_axis(seqs, parents[..., None], axis=1)", "seqs", "check-beam-search")
mutant("beam_search", "stopping when each source's best hypothesis is finished",
       "        if finished.all():\n", "        if finished[:, 0].all():\n", "check-beam-search",
       hint="stopping when the best hypothesis of each source is finished")
mutant("beam_search", "<s> counted in the lengths (they start at 1)",
       "lengths = np.zeros((B, K), dtype=np.int64)", "lengths = np.ones((B, K), dtype=np.int64)",
       "check-beam-search", hint="counting <s> in the lengths")
mutant("beam_search", "never stopping early (every hypothesis finished: the steps go on)",
       "        if finished.all():\n            break\n", "", "check-beam-search")
mutant("beam_search", "rows left the identity: the model's cache never reordered",
       "        rows = (parents + K * np.arange(B)[:, None]).reshape(-1)\n", "",
       "check-beam-search", hint="rows left the identity")
mutant("beam_search", "rows not offset by the source (b * K forgotten)",
       "rows = (parents + K * np.arange(B)[:, None]).reshape(-1)", "rows = parents.reshape(-1)",
       "check-beam-search")
mutant("beam_search", "step given the last tokens only, not the whole prefixes",
       "step(seqs.reshape(B * K, -1), rows)", "step(seqs.reshape(B * K, -1)[:, -1:], rows)",
       "check-beam-search", hint="passing step the last tokens only")
mutant("beam_search", "the model's log-probabilities read as (K, B, V)",
       "step(seqs.reshape(B * K, -1), rows).reshape(B, K, -1)",
       "step(seqs.reshape(B * K, -1), rows).reshape(K, B, -1).transpose(1, 0, 2)",
       "check-beam-search", hint="logp read as (K, B, V)")
mutant("memory_keys_values", "the memory's keys and values swapped",
       "return split_heads(k, num_heads), split_heads(v, num_heads)",
       "return split_heads(v, num_heads), split_heads(k, num_heads)", "check-decoder-step",
       hint="the memory's keys and values swapped")
mutant("memory_keys_values", "the value bias left out", 'params["W_v"], params.get("b_v"))',
       'params["W_v"], None)', "check-decoder-step", hint="without the bias b_v")
mutant("memory_keys_values", "keys and values both from W_k",
       'v, _ = linear_forward(memory, params["W_v"], params.get("b_v"))',
       'v, _ = linear_forward(memory, params["W_k"], params.get("b_k"))', "check-decoder-step")
mutant("cached_self_attention_step", "the cache copied, then written: the caller's stays empty",
       "    K[:, :, length:end] = k\n    V[:, :, length:end] = v\n",
       "    K, V = K.copy(), V.copy()\n    K[:, :, length:end] = k\n    V[:, :, length:end] = v\n",
       "check-decoder-step", hint="with no cache written")
mutant("cached_self_attention_step", "the new keys written at the start of the cache",
       "K[:, :, length:end] = k", "K[:, :, :end - length] = k", "check-decoder-step")
mutant("cached_self_attention_step", "no causal mask among several new positions",
       "heads, _ = attention_forward(q, K[:, :, :end], V[:, :, :end], mask)",
       "heads, _ = attention_forward(q, K[:, :, :end], V[:, :, :end])", "check-decoder-step")
mutant("cached_self_attention_step", "the mask causal_mask(t, length + t): not offset by length",
       "mask = causal_mask(end)[length:]", "mask = causal_mask(x.shape[1], end)",
       "check-decoder-step")
mutant("cached_self_attention_step", "attending to the new positions only (the cache unread)",
       "heads, _ = attention_forward(q, K[:, :, :end], V[:, :, :end], mask)",
       "heads, _ = attention_forward(q, k, v, causal_mask(x.shape[1]))", "check-decoder-step")
mutant("cached_self_attention_step", "the mask with >= : a new position blind to itself",
       "mask = causal_mask(end)[length:]",
       "mask = np.arange(end)[None, :] >= np.arange(length, end)[:, None]", "check-decoder-step",
       hint="a position must see itself")
mutant("cached_self_attention_step", "the packed projection cut in the order k, v, q",
       "q, k, v = (split_heads", "k, v, q = (split_heads", "check-decoder-step",
       hint="the queries cached as the keys")
mutant("cached_self_attention_step", "the packed projection cut in the order v, q, k",
       "q, k, v = (split_heads", "v, q, k = (split_heads", "check-decoder-step",
       hint="the values cached as the keys")
mutant("cached_self_attention_step", "q, k, v interleaved per head, (B, t, H, 3, Dh)",
       "q, k, v = (split_heads(a, num_heads) for a in np.split(qkv, 3, axis=-1))",
       "q, k, v = qkv.reshape(*qkv.shape[:2], num_heads, 3, -1).transpose(3, 0, 2, 1, 4)",
       "check-decoder-step", hint="cut per head")
mutant("decoder_layer_step", "the memory mask forgotten",
       "heads, _ = attention_forward(split_heads(q, c.num_heads), *memory_kv, memory_mask)",
       "heads, _ = attention_forward(split_heads(q, c.num_heads), *memory_kv)",
       "check-decoder-step")
mutant("decoder_layer_step", "always pre-norm", "x, _ = residual_forward(x, attend, p[\"norm1\"], "
       "c.norm_first, c.eps)", "x, _ = residual_forward(x, attend, p[\"norm1\"], True, c.eps)",
       "check-decoder-step")
mutant("decoder_layer_step", "every sublayer pre-norm, whatever config.norm_first says",
       "    x, _ = residual_forward(x, attend, p[\"norm1\"], c.norm_first, c.eps)\n"
       "    x, _ = residual_forward(x, cross, p[\"norm2\"], c.norm_first, c.eps)\n"
       "    x, _ = residual_forward(x, feed, p[\"norm3\"], c.norm_first, c.eps)\n",
       "    x, _ = residual_forward(x, attend, p[\"norm1\"], True, c.eps)\n"
       "    x, _ = residual_forward(x, cross, p[\"norm2\"], True, c.eps)\n"
       "    x, _ = residual_forward(x, feed, p[\"norm3\"], True, c.eps)\n",
       "check-decoder-step", hint="with the other norm order")
mutant("decoder_layer_step", "the config's eps not passed to the third norm",
       'x, _ = residual_forward(x, feed, p["norm3"], c.norm_first, c.eps)',
       'x, _ = residual_forward(x, feed, p["norm3"], c.norm_first)', "check-decoder-step")
mutant("decoder_layer_step", "the config's activation not passed on: ReLU always",
       'feed_forward_forward(h, p["ff"], c.activation)', 'feed_forward_forward(h, p["ff"])',
       "check-decoder-step", hint="with the relu activation where config.activation is 'gelu'")
mutant("decoder_layer_step", "a bias read by key: a model without biases raises KeyError",
       'p["cross_attn"].get("b_q")', 'p["cross_attn"]["b_q"]', "check-decoder-step")
mutant("transformer_decode_step", "learned positions ignored: the sinusoidal table always",
       'positions = params["tgt_pos"]["W"] if "tgt_pos" in params else pe', "positions = pe",
       "check-decoder-step")
mutant("transformer_decode_step", "the embeddings scaled whatever config.scale_embeddings says",
       "scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0",
       "scale = math.sqrt(c.d_model)", "check-decoder-step")
mutant("transformer_decode_step", "the target's embedding not scaled by sqrt(E)",
       "scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0", "scale = 1.0",
       "check-decoder-step")
mutant("transformer_decode_step", "the positions of the new tokens from 0 again",
       "positions = positions[length:]  # the rows of the new positions", "pass",
       "check-decoder-step")
mutant("transformer_decode_step", "the source's padding ignored (no memory mask)",
       "mask = merge_masks(None, src_pad)", "mask = None", "check-decoder-step")
mutant("transformer_decode_step", "one cache for every layer (the first layer's)",
       "y = decoder_layer_step(y, layer, c, cache, length, memory_kv, mask)",
       "y = decoder_layer_step(y, layer, c, caches[0], length, memory_kv, mask)",
       "check-decoder-step", hint="with one cache for every layer")
mutant("transformer_decode_step", "the final norm forgotten",
       'y, _ = layer_norm_forward(y, norm["gamma"], norm.get("beta"), c.eps)', "pass",
       "check-decoder-step")
