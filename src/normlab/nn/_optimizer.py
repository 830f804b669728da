"""The optimizer base: parameter checks, per-parameter state and its checkpoint.

Contract: `Optimizer` validates every parameter, gradient and state entry before a
`step` changes anything, and `load_state_dict` validates a whole state dict (PyTorch's
layout: `{"state": {index: {...}}, "param_groups": [{..., "params": [0, 1, ...]}]}`)
before it assigns. Sub-classes ([normlab.nn.optim][]) supply the hyperparameter and
state-entry checks and the update formula.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_bool,
    check_int,
    check_mapping,
    check_shape,
    check_writeable,
    compute_dtype,
    optional_grad,
    scalar_item,
)

__all__: list[str] = []  # the base class is private; SGD / AdamW are in optim.py


def _param_data(p: Any, i: int) -> np.ndarray:
    """`params[i].data`: a real floating ndarray (updated in place)."""
    if not isinstance(getattr(p, "data", None), np.ndarray):
        raise TypeError(
            f"params[{i}].data must be a numpy ndarray (updated in place); "
            f"got {type(getattr(p, 'data', None)).__name__}"
        )
    return as_float_array(p.data, f"params[{i}].data")


class Optimizer:
    """Shared parameter handling: validation, zero_grad, per-parameter state, checkpoints.

    Sub-classes define `_HYPER` (hyperparameter names), `_check_hyper` (validates a
    mapping of them, for `__init__` and `load_state_dict` alike) and `_check_entry`
    (validates one parameter's loaded state).
    """

    _HYPER: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], hyper: dict[str, Any]) -> None:
        if isinstance(params, np.ndarray) or not isinstance(params, Iterable):
            raise TypeError(
                "params must be an iterable of objects with .data and .grad "
                f"(e.g. a list of Parameters); got {type(params).__name__}"
            )
        plist = list(params)
        if not plist:
            raise ValueError("params is empty: the optimizer has nothing to update")
        for i, p in enumerate(plist):
            if not (hasattr(p, "data") and hasattr(p, "grad")):
                raise TypeError(
                    f"params[{i}] must have .data and .grad attributes; got {type(p).__name__}"
                )
            _param_data(p, i)
        self.params = plist
        self.state: dict[int, dict[str, Any]] = {}
        self._set_hyper(hyper)

    def _set_hyper(self, hyper: dict[str, Any]) -> None:
        for key, value in hyper.items():
            setattr(self, key, value)

    def _hyper(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._HYPER}

    @staticmethod
    def _state_dtype(p: Any) -> type[np.floating[Any]]:
        # float64 for float64 parameters of either byte order ('>f8' too), else float32
        return compute_dtype(p.data.dtype).type

    def _grads(self) -> list[np.ndarray | None]:
        """Every parameter, gradient and state entry, validated before anything is touched.

        A parameter with a gradient must have a writeable float `.data` whose shape and
        state dtype still match its optimizer state.
        """
        grads: list[np.ndarray | None] = []
        for i, p in enumerate(self.params):
            data = _param_data(p, i)
            g = optional_grad(p.grad, data.shape, f"params[{i}].grad")
            if g is not None:
                check_writeable(data, f"params[{i}].data")
                self._check_live_state(i, p)
            grads.append(g)
        return grads

    def _check_live_state(self, i: int, p: Any) -> None:
        dt = np.dtype(self._state_dtype(p))
        for key, value in self.state.get(i, {}).items():
            if isinstance(value, np.ndarray) and (value.shape != p.data.shape
                                                  or value.dtype != dt):
                raise ValueError(
                    f"state[{i}][{key!r}] has shape {value.shape} and dtype {value.dtype}, but "
                    f"params[{i}].data now needs shape {p.data.shape} and dtype {dt}: the "
                    "parameter changed after the optimizer was built; build a new optimizer"
                )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every `.grad` to None (PyTorch's default) or fill it with zeros in place."""
        set_to_none = check_bool(set_to_none, "set_to_none")
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad[...] = 0

    def state_dict(self) -> dict[str, Any]:
        """`{"state": {index: {name: value}}, "param_groups": [{hyperparameters, params}]}`
        (PyTorch's layout; arrays are copies, everything else Python scalars).

        Nested, so save it with [normlab.checkpoint.save][] (`np.savez` without
        pickle) or pickle.
        """
        state = {
            i: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for i, s in self.state.items()
        }
        group = {**self._hyper(), "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore hyperparameters and per-parameter state from `state_dict`.

        Everything is checked first (keys, the number of parameters, hyperparameters as in
        the constructor, each state array's shape, finiteness of counters); arrays are
        copied into the state dtype of their parameter (float32, or float64 for float64
        parameters). Scalars may be 0-d arrays (`np.load`). Nothing changes on error.

        Raises
        ------
        TypeError, ValueError
            Naming the offending entry.
        """
        if not isinstance(state, Mapping) or set(state) != {"state", "param_groups"}:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"state must be a mapping with keys 'param_groups' and 'state' "
                             f"(an optimizer state_dict); got {got}")
        group = _one_group(state["param_groups"], len(self.params), self._HYPER)
        try:
            hyper = self._check_hyper({k: group[k] for k in self._HYPER})
        except (TypeError, ValueError) as err:  # name where in the state dict it failed
            raise type(err)(f"state['param_groups'][0]: {err}") from None
        entries = state["state"]
        check_mapping(entries, "state['state']", "parameter index -> state entry")
        new: dict[int, dict[str, Any]] = {}
        for key, entry in entries.items():
            i = _index(key, len(self.params))
            check_mapping(entry, f"state['state'][{i}]", "one parameter's state")
            checked = self._check_entry(i, entry, hyper)
            if checked:
                new[i] = checked
        self._set_hyper(hyper)
        self.state = new

    def _check_hyper(self, values: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _check_entry(self, i: int, entry: Mapping[str, Any],
                     hyper: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _state_array(self, i: int, entry: Mapping[str, Any], key: str) -> np.ndarray:
        """A copy of `entry[key]` in the parameter's state dtype, of its shape."""
        name = f"state['state'][{i}][{key!r}]"
        arr = as_float_array(entry[key], name)
        check_shape(arr, self.params[i].data.shape, name, f"the shape of params[{i}].data")
        return np.array(arr, dtype=self._state_dtype(self.params[i]), copy=True)


def _one_group(groups: Any, n: int, keys: Sequence[str]) -> Mapping[str, Any]:
    """The single parameter group of a state dict, with params == [0, ..., n - 1]."""
    if not isinstance(groups, (list, tuple)) or len(groups) != 1:
        raise ValueError(f"state['param_groups'] must be a list of one group; got {groups!r}"[:200])
    group = groups[0]
    check_mapping(group, "state['param_groups'][0]", "hyperparameters and params")
    expected = {*keys, "params"}
    if set(group) != expected:
        raise ValueError(f"state['param_groups'][0] must have the keys {sorted(expected)}; "
                         f"got {sorted(group)}")
    indices = group["params"]
    if isinstance(indices, np.ndarray):
        indices = indices.tolist()
    if not isinstance(indices, (list, tuple)) or list(indices) != list(range(n)):
        raise ValueError(
            f"state['param_groups'][0]['params'] must be {list(range(n))[:8]}... for this "
            f"optimizer's {n} parameters; got {indices!r}"[:240]
        )
    return group


def _index(key: Any, n: int) -> int:
    i = check_int(scalar_item(key, "state['state'] key"), "state['state'] key", minimum=0)
    if i >= n:
        raise ValueError(f"state['state'] key must be a parameter index < {n}; got {key!r}")
    return i
