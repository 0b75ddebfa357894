"""Checks of notebook 00_gradients: ReLU and the linear layer (core), and the MSE exercise.

The core checks take 2-D inputs only: notebook 03 extends ``linear_forward`` and
``linear_backward`` to any leading axes and checks that. References are PyTorch (functional ops,
autograd for the gradients); the linear layer's autograd reference is itself checked against a
central-difference gradient in float64. The hints are computed from the reference (a mean where
a sum belongs is the reference divided by N, ...), so they show no NumPy answer.
"""

from __future__ import annotations

import numpy as np

from transformer_lab.checks._torch_helpers import _t, autograd, torch
from transformer_lab.checks.framework import Case, Check, later_rng, normals

# --------------------------------------------------------------------------------------------
# Section 4: ReLU


class Relu(Check, id="check-relu", functions=("relu_forward", "relu_backward")):
    def cases(self, rng):
        yield Case("a matrix (4, 5)", normals(rng, (4, 5), (4, 5)))
        x = rng.standard_normal((3, 4))
        x[0, 1] = x[1, 3] = x[2, 0] = 0.0
        yield Case("exact zeros in x (the gradient at 0 is 0, as in PyTorch)",
                   (x, rng.standard_normal((3, 4))))
        yield Case("float32", normals(rng, (2, 6), (2, 6), dtype=np.float32))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one axis", normals(rng, 7, 7))
        yield Case("three axes", normals(rng, (2, 3, 4), (2, 3, 4)))
        yield Case("all negative", (-np.abs(rng.standard_normal((2, 3))) - 0.1,
                                    rng.standard_normal((2, 3))))
        yield Case("zeros only", (np.zeros((2, 2)), rng.standard_normal((2, 2))))
    ### END HIDDEN TESTS

    def run(self, f, x, dout):
        out, cache = f.relu_forward(x)
        return {"out": out, "dx": f.relu_backward(dout, cache)}

    def expected(self, x, dout):
        out, dx = autograd(torch.relu, dout, x)
        return {"out": out, "dx": dx}

    def mistakes(self, x, dout):
        e = self.expected(x, dout)
        return {
            "with |x| for max(x, 0): a negative input gives 0, not its size":
            lambda: {**e, "out": np.abs(x)},
            "with a gradient of 1 at x = 0 (a mask x >= 0): PyTorch, and the course, take 0 "
            "there": lambda: {**e, "dx": np.where(x >= 0, dout, 0).astype(x.dtype)},
            "applying the ReLU to dout (max(dout, 0)): the mask must come from x, the input of "
            "the forward pass, which the cache holds": lambda: {**e, "dx": np.maximum(dout, 0)},
            "returning the mask itself: multiply dout by it": lambda: {**e, "dx": x > 0},
            "passing dout through unchanged: the cache is the mask x > 0 already (a bool array, "
            "so cache >= 0 is True everywhere); multiply dout by it": lambda: {**e, "dx": dout},
        }


# --------------------------------------------------------------------------------------------
# Section 6: the linear layer


def torch_linear(x, W, b, dout):
    """``x @ W + b`` (b None: ``x @ W``) under autograd: the output, dx, dW and db."""
    return autograd(lambda xt, Wt, bt: xt @ Wt if bt is None else xt @ Wt + bt, dout, x, W, b)


def linear_case(rng, lead, d_in, d_out, bias=True, dtype=np.float64, dout=True):
    """x (*lead, d_in), W (d_in, d_out), b (d_out,) or None and, with ``dout``, an upstream
    gradient (*lead, d_out), drawn in that order (notebook 03's batched checks use it too)."""
    x, W = normals(rng, (*lead, d_in), (d_in, d_out), dtype=dtype)
    b = normals(rng, d_out, dtype=dtype)[0] if bias else None
    return (x, W, b, *(normals(rng, (*lead, d_out), dtype=dtype) if dout else ()))


class LinearForward(Check, id="check-linear-forward", functions=("linear_forward",)):
    def cases(self, rng):
        yield Case("N = 5, D_in = 4, D_out = 3", linear_case(rng, (5,), 4, 3, dout=False))
        yield Case("no bias (b = None)", linear_case(rng, (5,), 4, 3, bias=False, dout=False))
        yield Case("a square W (D_in = D_out = 4)", linear_case(rng, (3,), 4, 4, dout=False))
        yield Case("float32", linear_case(rng, (4,), 3, 2, dtype=np.float32, dout=False))
        later = later_rng(rng)  # the case below was added later: the ones above stay as drawn
        yield Case("float32, no bias (float32 out: no float64 zeros for the missing bias)",
                   linear_case(later, (3,), 4, 2, bias=False, dtype=np.float32, dout=False))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one row (N = 1)", linear_case(rng, (1,), 3, 5, dout=False))
        yield Case("D_out = 1", linear_case(rng, (6,), 4, 1, dout=False))
        yield Case("D_in = 1, no bias", linear_case(rng, (3,), 1, 4, bias=False, dout=False))
        yield Case("float32, no bias, square W", linear_case(rng, (5,), 6, 6, bias=False,
                                                             dtype=np.float32, dout=False))
    ### END HIDDEN TESTS

    def run(self, f, x, W, b):
        return f.linear_forward(x, W, b)[0]

    def expected(self, x, W, b):
        return torch.nn.functional.linear(_t(x), _t(W).T, _t(b)).numpy()

    def mistakes(self, x, W, b):
        found = {"with the weight transposed (x @ W.T): our W is (D_in, D_out), the transpose "
                 "of PyTorch's nn.Linear.weight, and y = x @ W + b":
                 lambda: self.expected(x, W.T, b)}
        if b is not None:
            found["without adding the bias b"] = lambda: self.expected(x, W, None)
            found["subtracting the bias b where it is added (x @ W + b)"] = \
                lambda: self.expected(x, W, -b)
        return found


class LinearBackward(Check, id="check-linear-backward",
                     functions=("linear_forward", "linear_backward")):
    def cases(self, rng):
        yield Case("N = 5, D_in = 4, D_out = 3", linear_case(rng, (5,), 4, 3))
        yield Case("no bias (b = None): grads has W only", linear_case(rng, (5,), 4, 3, False))
        yield Case("a square W (D_in = D_out = 4)", linear_case(rng, (6,), 4, 4))
        yield Case("float32", linear_case(rng, (4,), 3, 2, dtype=np.float32))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("one row (N = 1)", linear_case(rng, (1,), 3, 5))
        yield Case("D_out = 1", linear_case(rng, (7,), 4, 1))
        yield Case("N = 64, D_in = D_out = 8", linear_case(rng, (64,), 8, 8))
        yield Case("float32, no bias, square W", linear_case(rng, (5,), 6, 6, False, np.float32))
    ### END HIDDEN TESTS

    def run(self, f, x, W, b, dout):
        _, cache = f.linear_forward(x, W, b)
        dx, grads = f.linear_backward(dout, cache)
        return {"dx": dx, "grads": grads}

    def expected(self, x, W, b, dout):
        _, dx, dW, db = torch_linear(x, W, b, dout)
        want = {"dx": dx, "grads": {"W": dW} if b is None else {"W": dW, "b": db}}
        if x.dtype == np.float64:
            _agrees_with_numerical_gradient(want, x, W, b, dout)
        return want

    def mistakes(self, x, W, b, dout):
        e = self.expected(x, W, b, dout)
        n = x.shape[0]

        def wrong(dx=e["dx"], **grads):
            return {"dx": dx, "grads": {**e["grads"], **grads}}

        found = {
            "with the transpose on the wrong side of dW (dout.T @ x): dW must have W's shape "
            "(D_in, D_out), and x.T @ dout is the product that has it":
            lambda: wrong(W=e["grads"]["W"].T),
            "with dx = dout @ W: the gradient of x multiplies by W transposed":
            lambda: wrong(dx=dout @ W),
            "averaging dW over the batch (dividing by N): every row of x contributes to the "
            "loss, and the contributions add up":
            lambda: wrong(W=e["grads"]["W"] / n),
        }
        if b is not None:
            found.update({
                "averaging the bias gradient over the batch (a mean): b is added to every row, "
                "so its gradient is the SUM of dout over the rows (section 3)":
                lambda: wrong(b=e["grads"]["b"] / n),
                "summing the bias gradient over the wrong axis (axis=1, the features): sum "
                "over the rows, axis=0":
                lambda: wrong(b=dout.sum(axis=1)),
                "keeping the summed axis (keepdims=True): db must have b's shape (D_out,)":
                lambda: wrong(b=e["grads"]["b"][None, :]),
            })
        return found


def _agrees_with_numerical_gradient(want, x, W, b, dout):
    """A guard on the reference: autograd's gradients of ``x @ W + b`` against central
    differences (float64, tolerance 1e-7)."""
    from transformer_lab.gradient_check import eval_numerical_gradient_array, rel_error

    arrays = {"dx": x, "W": W, "b": b}
    for name, grad in {"dx": want["dx"], **want["grads"]}.items():
        def linear(p, name=name):
            a = {**arrays, name: p}
            return a["dx"] @ a["W"] + (0.0 if a["b"] is None else a["b"])

        err = rel_error(grad, eval_numerical_gradient_array(linear, arrays[name].copy(), dout))
        if not err < 1e-7:
            raise RuntimeError(f"check-linear-backward's reference: autograd and the numerical "
                               f"gradient of {name} differ by {err:.1e}")


# --------------------------------------------------------------------------------------------
# Exercise: the mean squared error (a notebook function)


class MSELoss(Check, id="check-mse", arguments=("mse_loss",)):
    def cases(self, rng):
        yield Case("shape (3, 2, 4)", normals(rng, (3, 2, 4), (3, 2, 4)))
        yield Case("a column (5, 1)", normals(rng, (5, 1), (5, 1)))
        yield Case("float32 (dP stays float32)", normals(rng, (4, 3), (4, 3), dtype=np.float32))

    ### BEGIN HIDDEN TESTS
    def hidden_cases(self, rng):
        yield Case("1-D, worked by hand", (np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0])))
        yield Case("one entry", (np.array([[0.5]]), np.array([[-1.5]])))
        yield Case("P == Y (zero loss, zero gradient)", (np.full((2, 3), 0.25),
                                                         np.full((2, 3), 0.25)))
    ### END HIDDEN TESTS

    def run(self, f, P, Y):
        loss, dP = f.mse_loss(P, Y)
        return {"loss": loss, "dP": dP, "the loss is a float": isinstance(loss, float)}

    def expected(self, P, Y):
        loss, dP = autograd(lambda pt: torch.nn.functional.mse_loss(pt, _t(Y)), None, P)
        # the loss as a NumPy scalar of P's dtype: a float32 loss is compared to float32 precision
        return {"loss": loss[()], "dP": dP, "the loss is a float": True}

    def mistakes(self, P, Y):
        e = self.expected(P, Y)
        n, rows = P.size, (P.shape[0] if P.ndim else 1)
        found = {
            "without the factor 2 of the square's derivative": lambda: {**e, "dP": e["dP"] / 2},
            "without dividing the gradient by the number of entries (the gradient of the sum, "
            "not of the mean)": lambda: {**e, "dP": e["dP"] * n},
            "with the sum of the squares as the loss instead of their mean":
            lambda: {**e, "loss": e["loss"] * n},
        }
        found["returning the loss as a NumPy scalar (np.mean gives one): return "
              "float(...)"] = lambda: {**e, "the loss is a float": False}
        if rows != n:
            found["averaging over the rows only (dividing by P.shape[0]): the mean is over "
                  "every entry, P.size of them"] = lambda: {
                      **e, "loss": (e["loss"] * n / rows).astype(e["loss"].dtype),
                      "dP": (e["dP"] * n / rows).astype(P.dtype)}
            found["dividing by the number of rows (P.shape[0]) instead of the number of "
                  "entries (P.size)"] = lambda: {**e, "dP": e["dP"] * n / rows}
        return found
