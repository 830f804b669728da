"""Composition: :class:`Sequential`, :class:`Residual` (pre/post norm), :class:`PreNormStack`.

Contract: containers own no arithmetic except the residual addition; backward runs the
children's backward in reverse order. In a residual block the gradient of the input is the
sum of the identity path and the branch (chapter eq. 16.4): for pre-norm
``dx = dout + Norm'(F'(dout))``, so with a branch whose output is zero ``dx == dout``
exactly; for post-norm the identity path passes through the norm's Jacobian,
``dx = ds + F'(ds)`` with ``ds = Norm'(dout)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from normlab._validate import as_float_array, compute_dtype
from normlab.nn.module import Module
from normlab.nn.normalization import LayerNorm, RMSNorm
from normlab.norms import (
    add_layer_norm_backward,
    add_layer_norm_forward,
    add_rms_norm_backward,
    add_rms_norm_forward,
)

__all__ = ["PreNormStack", "Residual", "Sequential", "input_grad"]


def input_grad(module: Module, dout: np.ndarray) -> np.ndarray:
    """``module.backward(dout)``, which must be an array (not None as for Embedding)."""
    dx = module.backward(dout)
    if dx is None:
        raise TypeError(
            f"{type(module).__name__} returns no input gradient (integer input?) and cannot "
            "be followed by another layer's backward"
        )
    return dx


class Sequential(Module):
    """Apply modules in order; backward in reverse order.

    Children are registered as ``"0"``, ``"1"``, ... (so parameter names read ``0.weight``).

    Raises
    ------
    TypeError
        When an argument is not a Module.

    Examples
    --------
    >>> from normlab.nn import Linear, ReLU
    >>> rng = np.random.default_rng(0)
    >>> net = Sequential(Linear(4, 8, rng=rng), ReLU(), Linear(8, 2, rng=rng))
    >>> net(np.ones((3, 4), dtype=np.float32)).shape
    (3, 2)
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m.forward(x)
        return x

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        mods = list(self._modules.values())
        for m in reversed(mods[1:]):
            dout = input_grad(m, dout)
        return mods[0].backward(dout) if mods else dout


class Residual(Module):
    """Residual block with the norm before the branch (pre) or after the addition (post).

    pre:  y = x + F(Norm(x))        post: y = Norm(x + F(x))        (Xiong et al. 2020)

    For ``placement="post"`` with a :class:`LayerNorm` or :class:`RMSNorm` the addition and
    the norm run as one fused call (``add_layer_norm_forward`` / ``add_rms_norm_forward``),
    whose backward returns the gradient of the sum directly; other norms (or ``norm=None``,
    a plain ``x + F(x)``) are composed from their own forward/backward.

    Parameters
    ----------
    sublayer : Module
        F, mapping x's shape to x's shape.
    norm : Module or None
        The normalisation layer (its parameters belong to this block).
    placement : {"pre", "post"}

    Raises
    ------
    TypeError, ValueError
        On non-Module arguments or another placement.

    Examples
    --------
    >>> from normlab.nn import LayerNorm, Linear
    >>> blk = Residual(Linear(4, 4, rng=np.random.default_rng(0)), LayerNorm(4), "pre")
    >>> blk(np.ones((2, 4), dtype=np.float32)).shape
    (2, 4)
    """

    def __init__(
        self,
        sublayer: Module,
        norm: Module | None,
        placement: str = "pre",
    ) -> None:
        super().__init__()
        if not isinstance(sublayer, Module):
            raise TypeError(f"sublayer must be a normlab.nn.Module; got {sublayer!r}")
        if norm is not None and not isinstance(norm, Module):
            raise TypeError(f"norm must be a normlab.nn.Module or None; got {norm!r}")
        if placement not in ("pre", "post"):
            raise ValueError(f"placement must be 'pre' or 'post'; got {placement!r}")
        self.placement = placement
        self.norm = norm
        self.sublayer = sublayer

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        norm = self.norm
        if norm is None:
            self._save(("plain",))
            return x + self.sublayer.forward(x)
        if self.placement == "pre":
            self._save(("pre",))
            return x + self.sublayer.forward(norm.forward(x))
        f = self.sublayer.forward(x)
        if isinstance(norm, (LayerNorm, RMSNorm)):
            # fused add + norm; new_residual (x + F(x)) is not needed after a post-norm block
            return self._fused_post_forward(norm, f, x)
        self._save(("post",))
        return norm.forward(x + f)

    def _fused_post_forward(
        self, norm: LayerNorm | RMSNorm, f: np.ndarray, x: np.ndarray
    ) -> np.ndarray:
        dt = compute_dtype(x.dtype)
        k = len(norm.normalized_shape)
        w = None if norm.weight is None else norm.weight.data.astype(dt, copy=False)
        if isinstance(norm, LayerNorm):
            b = None if norm.bias is None else norm.bias.data.astype(dt, copy=False)
            out, _, ln_cache = add_layer_norm_forward(f, x, w, b, norm.eps, normalized_ndim=k)
            self._save(("fused", ln_cache))
        else:
            out, _, rms_cache = add_rms_norm_forward(
                f, x, w, norm.eps, offset=norm.offset, normalized_ndim=k
            )
            self._save(("fused", rms_cache))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        kind, *rest = self._take()
        norm = self.norm
        if kind == "plain" or norm is None:
            return dout + input_grad(self.sublayer, dout)
        if kind == "pre":
            # identity path + branch: dx = dout + Norm'(F'(dout))
            return dout + input_grad(norm, input_grad(self.sublayer, dout))
        if kind == "fused":
            # no gradient arrives on new_residual (post-norm keeps only Norm(x + F(x)))
            if isinstance(norm, LayerNorm):
                ds, dgamma, dbeta = add_layer_norm_backward(dout, None, rest[0])
                if norm.bias is not None and dbeta is not None:
                    norm.bias.accumulate(dbeta)
            else:
                ds, dgamma = add_rms_norm_backward(dout, None, rest[0])
            if norm.weight is not None and dgamma is not None:
                norm.weight.accumulate(dgamma)
        else:
            ds = input_grad(norm, dout)
        # the sum s = x + F(x) sends ds to x directly and through F
        return ds + input_grad(self.sublayer, ds)

    def extra_repr(self) -> str:
        return f"placement={self.placement!r}"


class PreNormStack(Module):
    """A stack of pre-norm blocks followed by the final norm before the output head.

    y = FinalNorm(Block_L(...Block_1(x))). Pre-norm leaves the residual stream itself
    unnormalised, so its scale grows with depth; the final norm brings it back (GPT-2,
    Xiong et al. 2020). With ``final_norm=None`` it is a plain :class:`Sequential`.

    Parameters
    ----------
    blocks : sequence of Module
        Registered as ``blocks.0``, ``blocks.1``, ...
    final_norm : Module or None

    Examples
    --------
    >>> from normlab.nn import LayerNorm, Linear
    >>> rng = np.random.default_rng(0)
    >>> blocks = [Residual(Linear(4, 4, rng=rng), LayerNorm(4), "pre") for _ in range(2)]
    >>> PreNormStack(blocks, LayerNorm(4))(np.ones((1, 4), dtype=np.float32)).shape
    (1, 4)
    """

    def __init__(self, blocks: Sequence[Module], final_norm: Module | None) -> None:
        super().__init__()
        if final_norm is not None and not isinstance(final_norm, Module):
            raise TypeError(f"final_norm must be a normlab.nn.Module or None; got {final_norm!r}")
        self.blocks = Sequential(*blocks)
        self.final_norm = final_norm

    def forward(self, x: Any) -> Any:
        h = self.blocks.forward(x)
        return h if self.final_norm is None else self.final_norm.forward(h)

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        if self.final_norm is not None:
            dout = input_grad(self.final_norm, dout)
        return self.blocks.backward(dout)
