"""Benchmark of the fused kernels and of emulated low-precision training (`normlab bench`).

Run `normlab bench` (or `python -m normlab.bench`); `--quick` for a smoke run,
`--markdown` for markdown tables, `--json PATH` to also save the raw numbers, `--only
SECTION,...` for some sections. Each section first checks correctness, then times:

- **kernels** ([normlab.bench.norm_cases][], [normlab.bench.quantize_cases][],
  [normlab.bench.channel_norm_cases][]): LayerNorm / RMSNorm forward + backward (also at
  the small shapes (8, 64) and (64, 512), where a call's time is overhead, not bandwidth),
  quantize to bf16 and fp8 E4M3, BatchNorm and GroupNorm forward + backward, each with and
  without `out=` buffers, beside the NumPy reference, PyTorch's CPU ops and ml_dtypes. Each
  time is related to the memory-bandwidth bound: bytes that must move divided by the copy
  bandwidth measured in the same run ([normlab.bench.bandwidth][]), and to that bound plus
  the OS's zero-fill of the pages of new output arrays. Also: peak extra memory of a norm
  forward + backward ([normlab.bench.memory][]) and first-call compile time of the kernels
  with an empty and a warm on-disk cache ([normlab.bench.compile_time][]).
- **torch-quantize** ([normlab.bench.torch_quantize][], needs PyTorch):
  `normlab.torch.quantize` against the numba kernel (CPU) and an fp8 round trip (CUDA).
- **training** ([normlab.bench.training][], needs PyTorch): emulated low-precision training
  of a 2-block MLP, each recipe's step time over the unconverted step, fp32 and bf16
  models, and its saved-for-backward bytes over the unconverted bf16 model's, with
  torchao's float8 emulation beside them when torchao is installed.

Every timing goes through one helper, [normlab.bench.timing][]: `measure` repeats a call
until its median is stable (median, minimum and interquartile spread reported; a warning
when a spread exceeds 10% or the load average shows other processes on the cores), and
`alternate` times two calls in alternating rounds. The core library never imports this
package, and this package imports PyTorch only for its torch sections: `import
normlab.bench` works without it. The command's sections are in [normlab.bench.command][];
each module's helpers are imported from that module.
"""

from __future__ import annotations

from normlab.bench.command import main

__all__ = ["main"]
