"""Clear errors at the boundary for mistakes that used to pass silently or confusingly."""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab.cli import main
from normlab.precision import quantize


@pytest.mark.parametrize("seed", [str(2**64), str(2**70), "-1"])
def test_a_seed_outside_64_bits_is_a_usage_error(seed, capsys):
    assert main(["run", "invariance", "--quick", "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "2**64" in err and "Traceback" not in err


def test_the_largest_seed_is_accepted_by_the_parser():
    from normlab.cli import build_parser

    args = build_parser().parse_args(["run", "invariance", "--seed", str(2**64 - 1)])
    assert args.seed == 2**64 - 1


def test_quantize_without_a_format_names_fmt():
    with pytest.raises(TypeError, match=r"fmt must be a Format.*got None"):
        quantize(np.ones(2, np.float32), None)


def test_batch_norm_refuses_one_array_as_both_running_statistics():
    x = np.random.default_rng(0).standard_normal((8, 3))
    stats = np.zeros(3)
    with pytest.raises(ValueError, match="running_mean and running_var"):
        nl.batch_norm_forward(x, None, None, stats, stats, True)
    np.testing.assert_array_equal(stats, np.zeros(3))  # nothing updated
    both = np.zeros(6)
    with pytest.raises(ValueError, match="share memory"):
        nl.batch_norm_forward(x, None, None, both[:3], both[1:4], True)
    out, _ = nl.batch_norm_forward(x, None, None, both[:3], both[3:], True)  # disjoint: fine
    assert out.shape == x.shape
