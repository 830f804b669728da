"""`QuantConv1D`: Hugging Face's GPT-2 `Conv1D` (a linear layer with a transposed weight)
under a recipe.

Contract: a [QuantLinear][normlab.torch.training.linear.QuantLinear] whose weight Parameter has
`Conv1D`'s layout `(K, N)` (`nx` rows, `nf` columns), so the checkpoint keys and shapes of
the layer it replaces stay as they were and `state_dict`s load both ways. The GEMMs use
`weight.t()`, a view: autograd returns the weight gradient in the `(K, N)` layout, and the
values are those of a `QuantLinear` holding the transposed weight. Initialisation is
`Conv1D`'s (normal, std 0.02; zero bias). Nothing here imports `transformers`.
"""

from __future__ import annotations

from typing import Any

import torch

from normlab.torch.recipes import Recipe
from normlab.torch.training.linear import QuantLinear

__all__ = ["QuantConv1D"]


class QuantConv1D(QuantLinear):
    """GPT-2's `Conv1D` ($y = x W + b$, weight `(K, N)`) computed as a recipe would.

    Parameters
    ----------
    in_features : int
        K (`Conv1D.nx`), the size of the last input dimension.
    out_features : int
        N (`Conv1D.nf`), the size of the last output dimension.
    bias : bool, optional
        Add a learnable bias (`Conv1D` always has one). Default True.
    recipe : Recipe
        One of `normlab.torch.recipes.RECIPES` (keyword-only).
    process_group : torch.distributed.ProcessGroup or None, optional
        As for [QuantLinear][normlab.torch.training.linear.QuantLinear].
    seed_stream : int, optional
        As for [QuantLinear][normlab.torch.training.linear.QuantLinear].
    exact_gemm : bool, optional
        As for [QuantLinear][normlab.torch.training.linear.QuantLinear]. Default False.
    device : torch.device or None, optional
        Where the parameters live.
    dtype : torch.dtype or None, optional
        The parameters' dtype.

    Attributes
    ----------
    weight : torch.nn.Parameter
        Shape (K, N), `Conv1D`'s layout: the transpose of a `QuantLinear`'s (N, K) weight.
    nf : int
        `Conv1D`'s name for the number of output features (`out_features`).
    nx : int
        `Conv1D`'s name for the number of input features (`in_features`).

    Examples
    --------
    >>> from normlab.torch.recipes import Bf16Recipe
    >>> layer = QuantConv1D(8, 3, recipe=Bf16Recipe())
    >>> tuple(layer.weight.shape), tuple(layer(torch.ones(2, 8)).shape)
    ((8, 3), (2, 3))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: Recipe, process_group: Any | None = None, seed_stream: int = 0,
                 exact_gemm: bool = False, device: Any = None, dtype: Any = None) -> None:
        # validate and set the recipe on meta (no storage, no initialisation), then give the
        # layer Conv1D's parameters and initialise them once
        super().__init__(in_features, out_features, bias, recipe=recipe,
                         process_group=process_group, seed_stream=seed_stream,
                         exact_gemm=exact_gemm, device="meta", dtype=dtype)
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(self.in_features, self.out_features,
                                                     **kw))  # K,N
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(self.out_features, **kw))  # N
        self.reset_parameters()

    @property
    def nf(self) -> int:
        """The number of output features, N (`Conv1D`'s attribute)."""
        return self.out_features

    @property
    def nx(self) -> int:
        """The number of input features, K (`Conv1D`'s attribute)."""
        return self.in_features

    def reset_parameters(self) -> None:
        """`Conv1D`'s initialisation (normal weight, std 0.02; zero bias), then a fresh
        recipe state on the weight's device."""
        torch.nn.init.normal_(self.weight, std=0.02)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._init_state(self.weight.device)

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        # Conv1D.forward's own arithmetic (addmm), errors included
        x2 = x.reshape(-1, x.shape[-1])  # M,K
        y = x2 @ self.weight if self.bias is None else torch.addmm(self.bias, x2, self.weight)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _gemm_weight(self) -> torch.Tensor:
        return self.weight.t()  # N,K view of the (K, N) Parameter
