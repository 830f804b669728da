"""Forward and backward against torch.nn.functional and autograd, in float64.

Tolerance: rtol 1e-10, atol 1e-12 everywhere: both sides compute the same float64 formulas
in different summation orders, which differ by a few ulps on O(1) values (atol) and by
relative ulp-level amounts on large gradients (rtol); a semantic difference (biased vs
unbiased variance, a momentum convention, a missing term) is orders of magnitude larger.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import normlab as nl  # noqa: E402  (after the optional-dependency skip)
from normlab._backend import use_backend  # noqa: E402

RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(autouse=True, params=["numba", "numpy"])
def backend(request):
    with use_backend(request.param):
        yield request.param


def close(a, b):
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def leaf(a):
    return None if a is None else torch.tensor(a, requires_grad=True)


def torch_grads(out, douts_and_outs, *leaves):
    loss = sum((o * torch.tensor(d)).sum() for d, o in douts_and_outs)
    loss.backward()
    return [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize(("shape", "k"), [((4, 6), 1), ((2, 3, 5), 1), ((2, 3, 5), 2),
                                          ((2, 2, 3, 4), 3)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm(rng, shape, k, affine):
    feat = shape[len(shape) - k :]
    x = rng.standard_normal(shape) * 2 + 0.5
    g = rng.standard_normal(feat) if affine != "none" else None
    b = rng.standard_normal(feat) if affine == "both" else None
    out, cache = nl.layer_norm_forward(x, g, b, 1e-4, normalized_ndim=k)
    tx, tg, tb = leaf(x), leaf(g), leaf(b)
    tout = F.layer_norm(tx, feat, tg, tb, 1e-4)
    close(out, tout)
    dout = rng.standard_normal(shape)
    dx, dg, db = nl.layer_norm_backward(dout, cache)
    gx, gg, gb = torch_grads(tout, [(dout, tout)], tx, tg, tb)
    close(dx, gx)
    for mine, ref in ((dg, gg), (db, gb)):
        assert (mine is None) == (ref is None)
        if mine is not None:
            close(mine, ref)


@pytest.mark.parametrize(("shape", "k"), [((4, 6), 1), ((2, 3, 5), 2)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm(rng, shape, k, offset):
    feat = shape[len(shape) - k :]
    x, w = rng.standard_normal(shape), rng.standard_normal(feat)
    out, cache = nl.rms_norm_forward(x, w, 1e-6, offset=offset, normalized_ndim=k)
    tx, tw = leaf(x), leaf(w)
    tout = F.rms_norm(tx, feat, tw + offset, 1e-6)
    close(out, tout)
    dout = rng.standard_normal(shape)
    dx, dw = nl.rms_norm_backward(dout, cache)
    gx, gw = torch_grads(tout, [(dout, tout)], tx, tw)
    close(dx, gx)
    close(dw, gw)


def test_rms_norm_without_weight(rng):
    x = rng.standard_normal((3, 7))
    out, _ = nl.rms_norm_forward(x, None, 1e-6)
    close(out, F.rms_norm(torch.tensor(x), (7,), None, 1e-6))


@pytest.mark.parametrize(("shape", "axis"), [((6, 4), -1), ((3, 4, 5), 1), ((2, 3, 2, 4), 1),
                                             ((3, 2, 4), -1)])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("unbiased", [True, False])
def test_batch_norm(rng, shape, axis, training, unbiased):
    c = shape[axis]
    x = rng.standard_normal(shape) * 3 - 1
    g, b = rng.standard_normal(c), rng.standard_normal(c)
    rm, rv = rng.standard_normal(c), rng.random(c) + 0.5
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    momentum = 0.7  # ours: fraction of the old statistic kept; PyTorch's is 1 - 0.7
    out, cache = nl.batch_norm_forward(x, g, b, rm, rv, training, momentum, 1e-4, axis=axis,
                                       unbiased_running_var=unbiased)
    tx, tg, tb = leaf(x), leaf(g), leaf(b)
    tout = F.batch_norm(tx.movedim(axis, 1), trm, trv, tg, tb, training, 1 - momentum,
                        1e-4).movedim(1, axis)
    close(out, tout)
    close(rm, trm)
    if unbiased or not training:
        close(rv, trv)
    else:  # biased: PyTorch's batch term is n/(n-1) times ours, i.e. larger by var/(n-1)
        n = x.size // c
        batch_var = np.moveaxis(x, axis, 0).reshape(c, -1).var(axis=1)
        close(rv, trv.numpy() - (1 - momentum) * batch_var / (n - 1))
    dout = rng.standard_normal(shape)
    dx, dg, db = nl.batch_norm_backward(dout, cache)
    gx, gg, gb = torch_grads(tout, [(dout, tout)], tx, tg, tb)
    close(dx, gx)
    close(dg, gg)
    close(db, gb)


@pytest.mark.parametrize(("shape", "groups"), [((3, 6), 3), ((2, 6, 5), 2), ((2, 4, 3, 2), 4),
                                               ((2, 4, 3, 2), 1)])
def test_group_norm(rng, shape, groups):
    c = shape[1]
    x, g, b = rng.standard_normal(shape), rng.standard_normal(c), rng.standard_normal(c)
    out, cache = nl.group_norm_forward(x, groups, g, b, 1e-4)
    tx, tg, tb = leaf(x), leaf(g), leaf(b)
    tout = F.group_norm(tx, groups, tg, tb, 1e-4)
    close(out, tout)
    dout = rng.standard_normal(shape)
    dx, dg, db = nl.group_norm_backward(dout, cache)
    gx, gg, gb = torch_grads(tout, [(dout, tout)], tx, tg, tb)
    close(dx, gx)
    close(dg, gg)
    close(db, gb)


def test_add_norms_against_autograd(rng):
    x, r = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    dout, dres = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    out, s, cache = nl.add_layer_norm_forward(x, r, g, b)
    tx, tr, tg, tb = leaf(x), leaf(r), leaf(g), leaf(b)
    ts = tx + tr
    tout = F.layer_norm(ts, (8,), tg, tb, 1e-5)
    close(out, tout)
    close(s, ts)
    dsum, dg, db = nl.add_layer_norm_backward(dout, dres, cache)
    gx, gr, gg, gb = torch_grads(tout, [(dout, tout), (dres, ts)], tx, tr, tg, tb)
    close(dsum, gx)
    close(dsum, gr)
    close(dg, gg)
    close(db, gb)

    out, s, cache = nl.add_rms_norm_forward(x, r, g, 1e-6, offset=1.0)
    tx, tr, tg = leaf(x), leaf(r), leaf(g)
    ts = tx + tr
    tout = F.rms_norm(ts, (8,), tg + 1.0, 1e-6)
    close(out, tout)
    dsum, dw = nl.add_rms_norm_backward(dout, dres, cache)
    gx, gr, gw = torch_grads(tout, [(dout, tout), (dres, ts)], tx, tr, tg)
    close(dsum, gx)
    close(dsum, gr)
    close(dw, gw)
