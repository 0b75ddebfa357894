"""The checks of notebooks 00 and 01: typical wrong answers fail with the case named and the
mistake's hint (that every check passes on the solutions, test_checks.py tests)."""

import math
from pathlib import Path

import nbformat
import numpy as np
import pytest

from transformer_lab.checks import CheckFailed, check
from transformer_lab.checks import framework as F
from transformer_lab.core import attention as CA
from transformer_lab.core import layers as CL

ROOT = Path(__file__).resolve().parents[1]


def _fails(check_id, *functions):
    with pytest.raises(CheckFailed) as err:
        check(check_id, *functions)
    return str(err.value)


def _solutions(notebook: str) -> dict:
    """The notebook's exercise cells, executed: name -> the solution functions they define."""
    nb = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)

    def softmax(x, axis=-1):  # the notebook's own softmax (section 3 of 01)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    namespace = {"np": np, "softmax": softmax}
    for cell in nb.cells:
        if cell.get("id", "").startswith("exercise-"):
            exec(cell.source, namespace)  # noqa: S102 -- our own notebook's solutions
    return namespace


# --- notebook 00: ReLU and the linear layer --------------------------------------------------

def test_relu_hints(monkeypatch):
    monkeypatch.setattr(CL, "relu_backward", lambda dout, cache: np.maximum(dout, 0))
    message = _fails("check-relu")
    assert "case 'a matrix (4, 5)'" in message and "output['dx']" in message
    assert "applying the ReLU to dout" in message
    monkeypatch.setattr(CL, "relu_backward", lambda dout, cache: cache)
    assert "returning the mask itself" in _fails("check-relu")


def test_linear_forward_hints(monkeypatch):
    original = CL.linear_forward
    monkeypatch.setattr(CL, "linear_forward", lambda x, W, b=None: original(x, W, None))
    message = _fails("check-linear-forward")
    assert "case 'N = 5, D_in = 4, D_out = 3'" in message and "without adding the bias" in message

    def transposed(x, W, b=None):
        return original(x, W.T, b) if W.shape[0] == W.shape[1] else original(x, W, b)
    monkeypatch.setattr(CL, "linear_forward", transposed)
    message = _fails("check-linear-forward")
    assert "case 'a square W (D_in = D_out = 4)'" in message
    assert "with the weight transposed (x @ W.T)" in message


def _linear_backward_with(db=None, dW=None, dx=None):
    """linear_backward with one of its three gradients computed wrongly."""
    def backward(dout, cache):
        x, W, b = cache
        grads = {"W": x.T @ dout if dW is None else dW(x, W, dout)}
        if b is not None:
            grads["b"] = dout.sum(axis=0) if db is None else db(dout)
        return (dout @ W.T if dx is None else dx(x, W, dout)), grads
    return backward


@pytest.mark.parametrize("wrong, case, hint", [
    (dict(db=lambda d: d.mean(axis=0)), "N = 5, D_in = 4, D_out = 3",
     "averaging the bias gradient over the batch"),
    (dict(db=lambda d: d.sum(axis=1)), "N = 5, D_in = 4, D_out = 3",
     "summing the bias gradient over the wrong axis"),
    (dict(db=lambda d: d.sum(axis=0, keepdims=True)), "N = 5, D_in = 4, D_out = 3",
     "keeping the summed axis (keepdims=True)"),
    (dict(dW=lambda x, W, d: (x.T @ d) / len(x)), "N = 5, D_in = 4, D_out = 3",
     "averaging dW over the batch"),
    (dict(dW=lambda x, W, d: d.T @ x if W.shape[0] == W.shape[1] else x.T @ d),
     "a square W (D_in = D_out = 4)", "with the transpose on the wrong side of dW"),
    (dict(dx=lambda x, W, d: d @ W if W.shape[0] == W.shape[1] else d @ W.T),
     "a square W (D_in = D_out = 4)", "with dx = dout @ W"),
])
def test_linear_backward_hints(monkeypatch, wrong, case, hint):
    monkeypatch.setattr(CL, "linear_backward", _linear_backward_with(**wrong))
    message = _fails("check-linear-backward")
    assert f"case {case!r}" in message, message
    assert hint in message, message


def test_linear_backward_without_bias_has_no_b_key(monkeypatch):
    def always_b(dout, cache):
        x, W, _ = cache
        return dout @ W.T, {"W": x.T @ dout, "b": dout.sum(axis=0)}
    monkeypatch.setattr(CL, "linear_backward", always_b)
    message = _fails("check-linear-backward")
    assert "case 'no bias (b = None): grads has W only'" in message
    assert "has keys not expected ['b']: it must have exactly the keys ['W'], got ['W', 'b']" \
        in message


def test_mse_hints():
    def no_two(P, Y):
        return float(np.mean((P - Y) ** 2)), (P - Y) / (P - Y).size
    assert "without the factor 2" in _fails("check-mse", no_two)

    def per_row(P, Y):
        return float(np.mean((P - Y) ** 2)), 2 * (P - Y) / P.shape[0]
    message = _fails("check-mse", per_row)
    assert "case 'shape (3, 2, 4)'" in message and "dividing by the number of rows" in message

    def array_loss(P, Y):
        return np.mean((P - Y) ** 2, keepdims=True).reshape(()), 2 * (P - Y) / (P - Y).size
    assert "the loss is a float" in _fails("check-mse", array_loss)


# --- notebook 01: the softmax and attention ----------------------------------------------------

def test_a_forward_returning_its_output_alone_is_told_what_the_check_unpacks(monkeypatch):
    """Whether the check unpacks it (check-relu) or indexes it (check-linear-forward, where an
    array's first row came back as the output and a shape was reported); the returns that give
    no pair are named."""
    def relu_forward(x):
        return np.maximum(x, 0)

    def linear_forward(x, W, b=None):
        if b is None:
            return x @ W
        return x @ W + b, (x, W, b)

    monkeypatch.setattr(CL, "relu_forward", relu_forward)
    monkeypatch.setattr(CL, "linear_forward", linear_forward)
    relu_line = relu_forward.__code__.co_firstlineno + 1
    linear_line = linear_forward.__code__.co_firstlineno + 2  # the early return
    for check_id, name, shape, line in (("check-relu", "relu", "(4, 5)", relu_line),
                                        ("check-linear-forward", "linear", "(5, 3)",
                                         linear_line)):
        message = _fails(check_id)
        assert f": {name}_forward returned an array of shape {shape}, not the pair (out, cache) " \
            f"of a forward pass: every return must give it, and the return at line {line} " \
            "does not" in message, message
        assert "your code raised" not in message


def test_softmax_hints(monkeypatch):
    original = CL.softmax_forward

    def over_axis_0(x, out=None):
        e = np.exp(x - x.max(axis=0, keepdims=True))
        y = e / e.sum(axis=0, keepdims=True)
        return y, y
    monkeypatch.setattr(CL, "softmax_forward", over_axis_0)
    message = _fails("check-softmax-forward")
    assert "case 'a square matrix (4, 4)'" in message and "(axis=0) instead of the last" in message

    def no_keepdims(x, out=None):
        if x.ndim == 2 and x.shape[0] == x.shape[1]:
            e = np.exp(x - x.max(axis=-1))
            y = e / e.sum(axis=-1)
            return y, y
        return original(x)
    monkeypatch.setattr(CL, "softmax_forward", no_keepdims)
    message = _fails("check-softmax-forward")
    assert "case 'a square matrix (4, 4)'" in message and "without keepdims=True" in message

    for where in ("maximum", "sum"):  # one of the two without keepdims (a 2-D x: no guard)
        def one_without(x, out=None, where=where):
            e = np.exp(x - x.max(axis=-1, keepdims=where == "sum"))
            y = e / e.sum(axis=-1, keepdims=where == "maximum")
            return y, y
        monkeypatch.setattr(CL, "softmax_forward", one_without)
        message = _fails("check-softmax-forward")
        assert f"you get taking the {where} without keepdims=True" in message, message


def _attention(scale_of, dim=-1):
    """attention_forward with the scores scaled by ``scale_of(d_k, scale)`` and the softmax
    over ``dim``; the cached scale is the right one."""
    def forward(q, k, v, mask=None, scale=None):
        want = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = q @ k.T * scale_of(q.shape[-1], scale)
        e = np.exp(s - s.max(axis=dim, keepdims=True))
        w = e / e.sum(axis=dim, keepdims=True)
        return w @ v, (q, k, v, w, want)
    return forward


@pytest.mark.parametrize("wrong, case, hint", [
    (_attention(lambda d, s: 1 / math.sqrt(d), dim=0), "T = S = 4, d_k = d_v = 3",
     "with the softmax over the queries (axis 0)"),
    (_attention(lambda d, s: 1 / d), "T = S = 4, d_k = d_v = 3",
     "dividing the scores by d_k instead of sqrt(d_k)"),
    (_attention(lambda d, s: 1 / math.sqrt(d)), "scale = 0.3 given (d_k = 4)",
     "ignoring the scale argument"),
    (_attention(lambda d, s: 1 / math.sqrt(d) if s is None else 1 / s),
     "scale = 0.3 given (d_k = 4)", "dividing by the scale instead of multiplying by it"),
])
def test_attention_hints(monkeypatch, wrong, case, hint):
    monkeypatch.setattr(CA, "attention_forward", wrong)
    message = _fails("check-attention-forward")
    assert f"case {case!r}" in message, message
    assert hint in message, message


def test_attention_float32_trap_and_the_cached_scale(monkeypatch):
    original = CA.attention_forward

    def np_sqrt(q, k, v, mask=None, scale=None):
        scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale  # a float64 scalar
        w = CL.softmax_forward(q @ k.T * scale)[0]
        return w @ v, (q, k, v, w, scale)
    monkeypatch.setattr(CA, "attention_forward", np_sqrt)
    message = _fails("check-attention-forward")
    assert "case 'float32, d_k = 8'" in message and "expected a float32 array, got float64" \
        in message and "d ** 0.5" in message

    def scale_not_kept(q, k, v, mask=None, scale=None):
        out, cache = original(q, k, v, mask, scale)
        return out, (*cache[:4], scale)
    monkeypatch.setattr(CA, "attention_forward", scale_not_kept)
    message = _fails("check-attention-forward")
    assert "output['scale in the cache']" in message
    assert "None: set it to the factor you multiplied the scores by" in message

    def not_multiplied(q, k, v, mask=None, scale=None):  # the usual slip: scale never applied
        w = CL.softmax_forward(q @ k.T)[0]
        return w @ v, (q, k, v, w, scale)
    monkeypatch.setattr(CA, "attention_forward", not_multiplied)
    assert "None: set it to the factor" in _fails("check-attention-forward")

    def not_applied(q, k, v, mask=None, scale=None):  # ... and once the cache holds it
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        w = CL.softmax_forward(q @ k.T)[0]
        return w @ v, (q, k, v, w, scale)
    monkeypatch.setattr(CA, "attention_forward", not_applied)
    message = _fails("check-attention-forward")
    assert "case 'T = S = 4, d_k = d_v = 3': output['out']" in message
    assert "without dividing the scores by sqrt(d_k)" in message


def test_variant_hints():
    def no_max_back(x, axis=-1):
        c = np.max(x, axis=axis, keepdims=True)
        return np.log(np.sum(np.exp(x - c), axis=axis))
    assert "without adding the maximum back" in _fails("check-logsumexp", no_max_back)

    cosine = _solutions("01_attention.ipynb")["cosine_attention"]
    message = _fails("check-cosine-attention", lambda q, k, v, tau=0.1: cosine(q, k, v, 1 / tau))
    assert "case 'B = 2, T = 3, S = 5, tau = 0.5'" in message
    assert "multiplying the cosines by tau instead of dividing" in message

    def no_tanh(q, k, v, W1, W2, w):
        s = ((q @ W1)[:, None, :] + (k @ W2)[None, :, :]) @ w
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        a = e / e.sum(axis=-1, keepdims=True)
        return a @ v, a
    assert "without the tanh" in _fails("check-additive-attention", no_tanh)



def _cosine_rest(qn, kn, v, tau):
    s = qn @ np.swapaxes(kn, -1, -2) / tau
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


def test_the_loop_rule_reads_loops_over_positions_not_over_arguments():
    def cosine_attention(q, k, v, tau=0.1):  # one comprehension over (q, k): allowed
        qn, kn = (a / np.linalg.norm(a, axis=-1, keepdims=True) for a in (q, k))
        return _cosine_rest(qn, kn, v, tau)
    check("check-cosine-attention", cosine_attention)

    def cosine_attention(q, k, v, tau=0.1):  # noqa: F811  (row by row: a loop over positions)
        qn = np.stack([r / np.linalg.norm(r, axis=-1, keepdims=True) for r in q])
        return _cosine_rest(qn, k / np.linalg.norm(k, axis=-1, keepdims=True), v, tau)
    message = _fails("check-cosine-attention", cosine_attention)
    assert "the answer is right, but `cosine_attention` runs a Python loop" in message


def test_a_core_function_using_torch_passes_with_a_note(monkeypatch, capsys):
    def relu_forward(x):
        import torch
        out = torch.relu(torch.from_numpy(x)).numpy()
        return out, x > 0
    monkeypatch.setattr(CL, "relu_forward", relu_forward)
    check("check-relu")
    assert "Note: `relu_forward` uses torch" in capsys.readouterr().out


def test_the_loop_rule_lets_a_loop_over_the_leading_axes_pass():
    """A retest's correct code that counted the leading axes in a loop: over the starred name of
    an unpacked shape, tuple/list/sorted of one, np.shape, range(np.ndim(x) - 1)."""
    import ast

    def loops(body):
        return F.def_loops(ast.parse(f"def f(x):\n    n = 1\n{body}    return n\n").body[0])

    for body in ("    *lead, d = x.shape\n    for m in lead:\n        n *= m\n",
                 "    for m in tuple(x.shape[:-1]):\n        n *= m\n",
                 "    for m in list(np.shape(x)[:-1]):\n        n *= m\n",
                 "    for m in sorted(x.shape):\n        n *= m\n",
                 "    for i in range(np.ndim(x) - 1):\n        n *= x.shape[i]\n",
                 "    lead: tuple = x.shape[:-1]\n    for m in lead:\n        n *= m\n",
                 "    for m in np.shape(x.real)[:-1]:\n        n *= m\n"):
        assert loops(body) == "none", body
    for body in ("    *lead, d = x\n    for m in lead:\n        n *= m\n",  # rows of x
                 "    *lead, d = x.shape\n    lead = x\n    for m in lead:\n        n *= m\n",
                 "    for m in list(x):\n        n *= m\n",
                 "    for i in range(np.size(x)):\n        n *= 2\n",
                 "    for m in model.shape(x):\n        n *= m\n",  # not NumPy's shape
                 # x, a parameter, bound again after the loop: the loop ran over the data
                 "    for r in x:\n        n += 1\n    *x, d = (1, 2)\n"):
        assert loops(body).startswith("a loop at line"), body


def test_the_loop_rule_is_not_fooled_by_a_fixed_looking_loop():
    """Loops a red team wrote to look fixed: unpacked into a literal, over the .shape of an
    object made for it, over range of a large constant, or a decorated def (what runs is the
    decorator's)."""
    import ast

    def loops(source):
        return F.def_loops(ast.parse(source).body[0])

    for body in ("for r in [*x]:\n        pass", "for i in (*range(len(x)),):\n        pass",
                 "for b in types.SimpleNamespace(shape=range(len(x))).shape:\n        pass",
                 "for i in range(1_000_000):\n        pass",
                 "for i in range(types.SimpleNamespace(ndim=len(x)).ndim):\n        pass",
                 "for i in range(x.ndim + 100):\n        pass",
                 "for i in range(0, len(x)):\n        pass",
                 "for i in range(x.ndim * x.size):\n        pass",
                 "return functools.reduce(lambda a, r: a + r, x, 0)",
                 "return reduce(np.add, x)",
                 "return list(itertools.starmap(g, zip(x)))",  # a retest's loops, passed once
                 # a fixed few, then changed in place or bound again another way
                 "names = ['a', 'b']\n    names[:] = x\n    for n in names:\n        pass",
                 "names = ('a', 'b')\n    with g(x) as names:\n        pass\n"
                 "    for n in names:\n        pass"):
        assert loops(f"def f(x):\n    {body}\n").startswith("a loop"), body
    assert "decorated" in loops("@lambda f: g\ndef f(x):\n    return x\n")
    assert loops("def f(x, rows=lambda x: [r for r in x]):\n    return rows(x)\n") \
        .startswith("a loop")  # in a default value
    assert "from a string (exec" in loops("def f(x):\n    exec('for r in x: pass')\n")
    for body in ("for a in (x, y):\n        pass", "for n in x.shape[1:]:\n        pass",
                 "for i in range(x.ndim):\n        pass", "for i in range(2):\n        pass",
                 "for i in range(x.ndim - 2):\n        pass",
                 "for i in range(0, 1):\n        pass",
                 "for i in range(x.ndim - 1, -1, -1):\n        pass",
                 "return np.add.reduce(x, axis=0)",  # a ufunc's loop runs inside NumPy
                 "return functools.reduce(np.maximum, (x, y))"):
        assert loops(f"def f(x, y):\n    {body}\n") == "none", body


def test_without_its_source_the_loop_rule_counts_every_loop_and_says_so():
    """A def run by exec (or in a %%time cell) has no source to read: every loop of its compiled
    code counts, a fixed few too, and the message says why (the grader reads the source)."""
    namespace: dict = {}
    exec("def f(q, k):\n    return [a + 1 for a in (q, k)]\n", namespace)  # noqa: S102
    found = F.python_loops(namespace["f"])
    assert found.startswith("a loop at line 2, read from the compiled code"), found
    exec("def g(q, k):\n    return q + k\n", namespace)  # noqa: S102
    assert F.python_loops(namespace["g"]) == "none"


def test_a_decoder_s_loop_over_the_steps_is_allowed_and_the_loops_inside_it_are_not():
    """sample_decode's rule (steps=True): the first while, or for over more than a fixed few
    things, is the loop over the steps (in a with, an if or a try too); a loop over the batch,
    inside it or beside it, still counts."""
    import ast

    def loops(source):
        return F.def_loops(ast.parse(source).body[0], steps=True)

    for head in ("for _ in range(n):", "while not done.all():"):
        assert loops(f"def f(x, n):\n    out = x\n    {head}\n        out = out + 1\n") \
            == "none", head
        assert loops(f"def f(x, n):\n    {head}\n        y = [r for r in x]\n") \
            == "a loop at line 3", head
        assert loops(f"def f(x, n):\n    {head}\n        pass\n    for r in x:\n"
                     "        pass\n") == "a loop at line 4", head
    assert loops("def f(x, n):\n    return [r for r in x]\n") == "a loop at line 2"
    # the step loop after a loop over a fixed few things, or inside a with, an if, a try
    step = "for _ in range(n):\n            y = x + 1\n"
    for source in ("def f(x, n):\n    for k in ('pad_id', 'eos_id'):\n        pass\n"
                   "    for _ in range(n):\n        y = x + 1\n",
                   f"def f(x, n):\n    with e:\n        {step}",
                   f"def f(x, n):\n    if n:\n        {step}",
                   f"def f(x, n):\n    try:\n        {step}    except E:\n        pass\n",
                   f"def f(x, n):\n    def run():\n        {step}    return run()\n"):
        assert loops(source) == "none", source
    # a closure's loop is the step loop only where the def's own body has none
    assert loops("def f(x, n):\n    def rows():\n        return [r for r in x]\n"
                 "    for _ in range(n):\n        y = rows()\n") == "a loop at line 3"
    assert loops(f"def f(x, n):\n    def run():\n        {step}            y = [r for r in x]\n"
                 "    return run()\n") == "a loop at line 5"
    # map and filter are loops over their iterables, but over a fixed few things
    assert loops("def f(x, n):\n    return list(map(g, x))\n") == "a loop at line 2"
    assert loops("def f(x, n):\n    return np.fromiter(map(g, x, n), int)\n") \
        == "a loop at line 2"
    assert loops("def f(x, n):\n    return list(map(np.asarray, (x, n)))\n") == "none"


def test_the_loop_rule_lets_a_loop_over_the_three_projections_pass():
    """A student's correct multi-head attention looped over "qkv", a dict's .items() or names
    assigned once from literals, and failed the rule; a name that grows, or is assigned twice,
    or a zip of two arrays, still counts as a loop."""
    import ast

    def loops(source):
        return F.def_loops(ast.parse(source).body[0])

    for body in ('for n in "qkv":\n        pass',
                 'for n, a in zip("qkv", (x, y, z)):\n        pass',
                 'for n, a in {"q": x, "k": y}.items():\n        pass',
                 'names = ["q", "k", "v"]\n    inputs = [x, y, z]\n'
                 '    out = [n for n, a in zip(names, inputs)]',
                 'pairs = (("q", x), ("k", y))\n    for n, a in pairs:\n        pass'):
        assert loops(f"def f(x, y, z):\n    {body}\n") == "none", body
    for body in ("xs = (x, y)\n    xs = list(x)\n    for a in xs:\n        pass",
                 "xs = []\n    xs.extend(x)\n    for a in xs:\n        pass",
                 "for a, b in zip(x, y):\n        pass",
                 'for c in "abcdefghijklmnopqrstuvwxyz":\n        pass'):
        assert loops(f"def f(x, y, z):\n    {body}\n").startswith("a loop"), body


def test_the_loop_rule_lets_a_loop_over_a_module_constant_pass(tmp_path, monkeypatch):
    """A name that the def's module binds once, at its top level, to a fixed few things is a
    fixed few things (a local alias of it and ``range(len(...))`` of it too; a local of the same
    name in another def changes nothing), unless the module rebinds or changes it or the def
    binds the name itself in any way; one bound to what a call returns still counts."""
    (tmp_path / "loop_rule_constants.py").write_text(
        "import contextlib\nimport numpy as np\n"
        "HEADS = ('W_q', 'W_k', 'W_v')\nKINDS: tuple[str, ...] = ('q', 'k')\n"
        "MANY = tuple(range(17))\nGROWN = ['q']\nTWICE = ('a',)\nTWICE = ('a', 'b')\n"
        "SLICED = ['a']\nSLICED[:] = []\n\n"
        "def other(x):\n    KINDS = x.shape\n    return KINDS\n\n"
        "def over_heads(x):\n    return [x for _ in HEADS]\n\n"
        "def over_kinds(x):\n    return {n: x for n in KINDS}\n\n"
        "def alias(x):\n    names = HEADS\n    return [x for _ in range(len(names))]\n\n"
        "def rebinds(x, HEADS):\n    return [x for _ in HEADS]\n\n"
        "def over_many(x):\n    return [x for _ in MANY]\n\n"
        "def over_grown(x):\n    GROWN.append(x)\n    return [x for _ in GROWN]\n\n"
        "def over_twice(x):\n    return [x for _ in TWICE]\n\n"
        "def over_sliced(x):\n    return [x for _ in SLICED]\n\n"
        "def nested(x):\n    def g(HEADS):\n        return [r for r in HEADS]\n    return g(x)\n\n"
        "def target(x):\n    return [[r for r in HEADS] for HEADS in (x,)]\n\n"
        "def with_as(x):\n    with contextlib.nullcontext(x) as HEADS:\n"
        "        return [r for r in HEADS]\n\n"
        "def through_globals(x):\n    globals()['HEADS'] = x\n    return [r for r in HEADS]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import loop_rule_constants as consts
    passing = ("over_heads", "over_kinds", "alias")
    for name in (*passing, "rebinds", "over_many", "over_grown", "over_twice", "over_sliced",
                 "nested", "target", "with_as", "through_globals"):
        assert F.python_loops(getattr(consts, name)).startswith("a loop") != (name in passing), \
            name
