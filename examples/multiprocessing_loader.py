"""normlab in worker processes: a process pool and a minimal data-loader pattern.

Workers quantize batches to fp8 and normalise them, as a data loader's `collate` step
might. Each worker gets its own seed (`SeedSequence.spawn`), so stochastic rounding is
reproducible and independent across workers, and the results are the same as computing the
batches in the parent, bit for bit.

The batches are computed three ways and must agree bit for bit: in this process, in a
`spawn` pool (works everywhere; each worker gets its own kernel threads) and, where the
platform has it, in a `fork` pool made after this process already ran the kernels (Linux's
default, and what PyTorch's DataLoader workers use). See "Running normlab in production".

Run: `python examples/multiprocessing_loader.py`.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

import normlab as nl
from normlab.precision import quantize

N_BATCHES, BATCH, WIDTH = 8, 64, 256


def collate(seed: np.random.SeedSequence) -> np.ndarray:
    """One batch: random data, stochastic rounding to E4M3, then LayerNorm (16.1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)  # B, W
    xq = quantize(x, "e4m3", rounding="stochastic", rng=rng)
    out, _ = nl.layer_norm_forward(xq, None, None)
    return out


def main() -> None:
    seeds = np.random.SeedSequence(2026).spawn(N_BATCHES)  # one independent stream per batch
    serial = [collate(seed) for seed in seeds]  # the same work in this process (kernels ran)
    methods = ["spawn"] + (["fork"] if "fork" in mp.get_all_start_methods() else [])
    for method in methods:
        with mp.get_context(method).Pool(2) as pool:
            batches = pool.map(collate, seeds)
        assert all(np.array_equal(a, b) for a, b in zip(batches, serial, strict=True)), method
    means = np.array([b.mean(axis=-1) for b in batches])  # N_BATCHES, B
    print(
        f"{len(batches)} batches of {batches[0].shape} from 2 workers ({', '.join(methods)}); "
        f"max |row mean| after LayerNorm {np.abs(means).max():.1e}; identical to serial"
    )


if __name__ == "__main__":
    main()
