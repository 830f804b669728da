"""The shared recipe arithmetic on CUDA: the CPU's bits, no host synchronisation.

Every QuantLinear operand (the six of the three GEMMs) computed on the GPU equals the same
operand computed on the CPU, which the differential suite ties to the NumPy functions and
the oracles; the delayed-scaling state stays on the device and equals the CPU's. CUDA's
sync debug mode turns any host read inside the shared functions into an error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))
import recipe_differential as diff

from normlab.precision import Fp8DelayedRecipe, get_format
from normlab.precision.scaled import arithmetic as recipe_core
from normlab.precision.scaled import scales
from normlab.precision.scaled import tiling as blocks
from normlab.torch.namespace import TORCH

pytestmark = pytest.mark.cuda


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.int32).numpy()


@pytest.mark.parametrize("kind", ["spread", "nan_block", "inf_block", "near_max"])
@pytest.mark.parametrize("recipe", sorted(diff.RECIPES))
def test_operands_on_cuda_equal_the_cpu(recipe: str, kind: str) -> None:
    r = diff.RECIPES[recipe]
    x = diff.make_input(kind, (diff.M, diff.K), 1)
    w = diff.make_input(kind, (diff.N, diff.K), 2)
    dy = diff.make_input(kind, (diff.M, diff.N), 3)
    cpu = diff.layer_operands(diff._layer(r, w), x, w, dy)
    gpu = diff.layer_operands(diff._layer(r, w).cuda(), x, w, dy)
    for slot, t in gpu.items():
        assert t.is_cuda, slot
        np.testing.assert_array_equal(_bits(t), _bits(cpu[slot]), err_msg=slot)


def test_delayed_state_stays_on_the_device_and_equals_the_cpu() -> None:
    recipe = Fp8DelayedRecipe(amax_history_len=4, reduce_amax=False)
    w = np.zeros((diff.N, diff.K), np.float32)
    cpu, gpu = diff._layer(recipe, w), diff._layer(recipe, w).cuda()
    for step, amax in enumerate(diff.TRACES["zero_nan_inf"]):
        arrays = [diff._step_input(amax, 10 * step + i, s) for i, s in
                  enumerate([(diff.M, diff.K), (diff.N, diff.K), (diff.M, diff.N)])]
        diff.layer_operands(cpu, *arrays)
        diff.layer_operands(gpu, *arrays)
        cpu.update_scales()
        gpu.update_scales()
        assert gpu.scale.is_cuda and gpu.amax_history.is_cuda
        np.testing.assert_array_equal(_bits(gpu.scale), _bits(cpu.scale))
        np.testing.assert_array_equal(_bits(gpu.amax_history), _bits(cpu.amax_history))


def test_shared_arithmetic_never_synchronises() -> None:
    x = torch.from_numpy(diff.make_input("nan_block", (diff.M, diff.K), 1)).cuda()
    e4m3 = get_format("e4m3")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        amax = blocks.block_amax(x, (32,), xp=TORCH)
        scales.scale_from_amax(amax, 448.0, margin=1, power_of_2_scales=True, xp=TORCH)
        h = scales.record_amax(torch.zeros(4, device="cuda"), amax.amax(), xp=TORCH)
        scales.delayed_update(h, torch.ones((), device="cuda"), 448.0, xp=TORCH)
        recipe_core.mx_quantize_parts(x, e4m3, block_size=32, axis=0, rule="ocp", xp=TORCH)
        recipe_core.nvfp4_quantize_parts(x, block=(16, 16), axis=-1, xp=TORCH)
        recipe_core.blockwise_quantize_parts(x, e4m3, block=(1, 32), xp=TORCH)
        s = recipe_core.current_scale(x, e4m3, xp=TORCH)
        recipe_core.per_tensor_quantize(x, e4m3, s, xp=TORCH)
    finally:
        torch.cuda.set_sync_debug_mode("default")
