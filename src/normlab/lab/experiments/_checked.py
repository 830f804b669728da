"""What each experiment checks and how it is set up, one table cell per experiment.

The lab tables of the README and of the documentation site show these cells in their
"what is checked" column (the registry's one-line titles are for the command line).
A cell names the model, the optimiser and the sizes that the experiment's docstring
states, so a reader sees the set-up beside the verdict; `tests/lab/test_configs.py`
compares them with what the experiments record that they ran.
"""

from __future__ import annotations

__all__ = ["CHECKED"]

CHECKED: dict[str, str] = {
    "xiong_init": "Post-LN ‖x_l‖²/d = 1.5 ± 0.1 at every layer; Pre-LN within "
    "[1 + l/2, 1 + 3l/2]; last-FFN gradient vs depth: Post-LN flat, Pre-LN ~ `L^-1/2`",
    "training_stability": "character LM on shipped text with the paper's initialisation "
    "(Xavier weights, zero biases, token embeddings N(0, 1/d) times sqrt(d), tied head), "
    "AdamW 0.9/0.98, 8 replicates at lr 0.02: Pre-LN trains without warmup (the mechanism "
    "check); Post-LN without warmup falls behind; warmup rescues it; \"Pre-LN without "
    "warmup is comparable to Post-LN with warmup\" (at its own lr 0.01), each on the 95% "
    "interval of the paired differences",
    "update_stall": "bf16 round-to-nearest stalls; master weights, Kahan and stochastic "
    "rounding: stored last-step weights within 2x the storage floor; swamping ratios fp16 "
    "2048x, bf16 256x",
    "loss_scaling": "dense regression with the loss a mean over `2^17` outputs (`2^20` with "
    "`--full`) and an output multiplier 1/4, He init, full-batch Adam lr 0.01, 8 "
    "replicates: histogram of fp32 gradients vs fp16's range; the dynamic scaler keeps them "
    "in range; unscaled fp16 falls behind (>= 10%); scaled fp16 matches fp32 (within 10%), "
    "each on the interval of the log loss ratio; per-layer weight-gradient error at S = 1",
    "invariance": "invariance under weight/data rescale and recentre, exactly in float64",
    "stats_precision": "float32 rows `randn + 2000`, width 4096: naive E[x²]-E[x]² vs the "
    "corrected two-pass reference and kernel, against float64",
    "batch_vs_layer": "the same example alone / in other batches / decoded token by token; "
    "BatchNorm's train/eval gap beside the sampling-noise prediction; MLP with and without "
    "BatchNorm (accuracy, input-distribution drift)",
    "dropout_stats": "mean x, variance x²p/(1-p), identity at eval",
    "fp8_formats": "max, min subnormal and range of E4M3 and E5M2 exactly; error over 50 "
    "binades; delayed vs current scaling on a drifting tensor",
    "xiong_gradients": "norm of the expected gradient of W1 and W2 per layer at init, 6 "
    "layers, the paper's initialisation, 10 seeds: Post-LN grows toward the top, Pre-LN "
    "flat; Post-LN leans further to the top than Pre-LN (the mechanism check)",
    "norm_speed": "RMSNorm vs LayerNorm forward+backward time, references and kernels, "
    "timed in alternation on this CPU; the order-statistic interval of the median ratio "
    "decides (a busy machine gives INCONCLUSIVE, not NOT REPRODUCED); the paper's 7%-64% "
    "shown, not judged",
    "residual_depth": "model update of one SGD step (lr 1e-5) on the weight matrices vs "
    "depth 6-48, as DeepNet's theorem has it (one AdamW step on every parameter shown "
    "beside it), 6 replicates; output change under perturbation over 8 stacks: Post-LN's "
    "grows faster than Pre-LN's, Pre-LN and Admin O(log N); Pre-LN's change not O(N) (the "
    "mechanism check)",
    "lowp_training": "char-LM training with FP8 delayed / current, MXFP8, NVFP4 vs bf16 "
    "with fp32 masters, 3 seeds; each claim on the 95% interval of the paired loss "
    "differences; mechanism checks: stochastic rounding unbiased, Hadamard spreads an "
    "outlier, 16x16 tiles give the same forward and dgrad weights",
}
"""Experiment name to its "what is checked" cell (Markdown, one line)."""
