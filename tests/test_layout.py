"""The layout by concern: every module path from before the move still imports, as itself.

Issue 29 moved `normlab/precision/*.py` into four subpackages and the torch training stack
into `normlab.torch.training`. A user's `import normlab.precision.recipes`, a pickle that
names `normlab.precision.fp8_scaling.Fp8Meta`, or a `from normlab.torch.nn import
QuantLinear` must keep working and give the very objects of the new paths (not copies,
which would break `isinstance` and identity checks).
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import normlab.precision

SRC = Path(normlab.precision.__file__).resolve().parents[1]

# old path -> new path, written out here (not read from the package's own table)
MOVED_PRECISION = {
    "codes": "formats.codes", "rounding": "formats.rounding", "modes": "formats.modes",
    "random_bits": "formats.random_bits", "format_table": "formats.table",
    "_round_scalar": "formats._round_scalar",
    "recipes": "scaled.recipes", "recipe_base": "scaled.recipe",
    "recipe_fp8": "scaled.fp8_recipes", "recipe_formats": "scaled.recipe_formats",
    "quantizer_base": "scaled.quantizer", "quantizers": "scaled.quantizers",
    "microscaling": "scaled.microscaling", "fp8_scaling": "scaled.fp8_scaling",
    "mx": "scaled.mx", "nvfp4": "scaled.nvfp4", "blockwise": "scaled.blockwise",
    "hadamard": "scaled.hadamard", "scales": "scaled.scales", "blocks": "scaled.tiling",
    "block_scales": "scaled.block_scales", "recipe_core": "scaled.arithmetic",
    "namespace": "scaled.namespace", "operand_codes": "operands.codes",
    "operand_pass": "operands.one_pass", "loss_scaling": "training.loss_scaling",
    "_scaler_ops": "training._scaler_ops", "master_weights": "training.master_weights",
    "mixed": "training.mixed_step", "lowp_update": "training.lowp_update",
    "matmul": "training.matmul",
}
MOVED_TORCH = {
    "nn": "linear", "conv1d": "conv1d", "optim": "optim", "convert": "convert",
    "_gemm": "_gemm", "_operand_ops": "_operand_ops", "_product_ops": "_product_ops",
    "_bf16_gemm": "_bf16_gemm", "_extra_state": "_extra_state", "_plan": "_plan",
    "_autocast": "_autocast", "_empty_batch": "_empty_batch", "recompute": "recompute",
    "switch": "switch", "training_mode": "training_mode", "distributed": "distributed",
    "steps": "steps", "nonfinite": "nonfinite",
}


@pytest.mark.parametrize("old", sorted(MOVED_PRECISION))
def test_old_precision_path_is_the_new_module(old: str) -> None:
    new = importlib.import_module(f"normlab.precision.{MOVED_PRECISION[old]}")
    assert importlib.import_module(f"normlab.precision.{old}") is new


def test_old_listings_path_is_the_lab_module() -> None:
    new = importlib.import_module("normlab.lab.listings")
    assert importlib.import_module("normlab.precision.listings") is new
    from normlab.precision.listings import round_to_bfloat16

    assert round_to_bfloat16 is new.round_to_bfloat16 is normlab.precision.round_to_bfloat16


def test_packages_that_kept_their_names_export_the_old_modules_names() -> None:
    # normlab.precision.formats and normlab.precision.operands were modules, now packages
    from normlab.precision.formats import FLOAT8_E4M3FN, Format, get_format
    from normlab.precision.formats.format import FLOAT8_E4M3FN as E4M3
    from normlab.precision.operands import fake_operand
    from normlab.precision.operands.operand import fake_operand as fake

    assert FLOAT8_E4M3FN is E4M3 and get_format("e4m3") is E4M3 and isinstance(E4M3, Format)
    assert fake_operand is fake


def test_removed_operand_spec_class_still_warns() -> None:
    with pytest.warns(DeprecationWarning, match="OperandSpec is deprecated"):
        from normlab.precision.operands import OperandSpec
    assert OperandSpec is normlab.precision.scaled.Quantizer


def test_old_path_in_a_pickle_loads_the_same_class() -> None:
    recipe = normlab.precision.Fp8DelayedRecipe(margin=1)
    # a pickle written before the move names the class by its old module path (protocol 0
    # is text: the path can be edited without length prefixes)
    old = pickle.dumps(recipe, protocol=0).replace(b"normlab.precision.scaled.fp8_recipes",
                                       b"normlab.precision.recipe_fp8")
    assert b"normlab.precision.recipe_fp8" in old
    back = pickle.loads(old)
    assert type(back) is normlab.precision.Fp8DelayedRecipe and back == recipe


def test_old_paths_import_in_a_fresh_interpreter() -> None:
    # a fresh process imports the old path first, before anything else of normlab
    code = ("import normlab.precision.mx as m, normlab.precision.scaled.mx as n; "
            "assert m is n; from normlab.precision.recipes import MXRecipe; "
            "from normlab.precision.scaled.recipes import MXRecipe as R; assert MXRecipe is R")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_precision_holds_at_most_ten_modules_directly() -> None:
    # issue 29's layout target: formats, scaled recipes, operands and training in subpackages
    direct = sorted(p.name for p in (SRC / "precision").glob("*.py"))
    assert len(direct) <= 10, direct


class TestTorch:
    torch = pytest.importorskip("torch")

    @pytest.mark.parametrize("old", sorted(MOVED_TORCH))
    def test_old_torch_path_is_the_new_module(self, old: str) -> None:
        new = importlib.import_module(f"normlab.torch.training.{MOVED_TORCH[old]}")
        assert importlib.import_module(f"normlab.torch.{old}") is new

    def test_names_that_were_functions_stay_functions(self) -> None:
        import normlab.torch as nt
        from normlab.torch.training.convert import convert

        # `normlab.torch.convert` was the function (the module shadowed by it) before too
        assert nt.convert is convert

    def test_old_class_paths(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            from normlab.torch.nn import QuantLinear
            from normlab.torch.optim import AdamW
        import normlab.torch as nt

        assert QuantLinear is nt.QuantLinear and AdamW is nt.AdamW
