"""Experiment: low-precision training recipes on a PyTorch character LM (needs `torch`).

Claims. Micikevicius et al. 2022 ("FP8 Formats for Deep Learning", section 4): training with
FP8 GEMMs (E4M3 forward, E5M2 gradients, per-tensor scaling) matches the 16-bit baseline's
loss within run-to-run variation. Rouhani et al. 2023 ("Microscaling Data Formats for Deep
Learning", section 6): MXFP8 training matches FP32/BF16. NVIDIA 2025 ("Pretraining Large
Language Models with NVFP4", sections 4-5): NVFP4 with its full recipe stays close to the
FP8 baseline, and removing stochastic rounding of gradients, the random Hadamard transform
of the weight-gradient inputs, or 2-D weight blocks each makes the loss worse.

Setup. A pre-LN decoder-only Transformer (learned positions, GELU MLP) is trained as a
character LM on the lab's shipped corpus with AdamW on float32 master weights. Every
`torch.nn.Linear` of the blocks becomes a `QuantLinear` with the recipe; the LM head runs
in bf16 in every configuration (as the FP8/NVFP4 recipes keep it in high precision); the
attention products stay float32. The baseline rounds every Linear operand to bf16 (bf16 with
fp32 masters). Each seed fixes the initial weights and the batches, identical across
recipes, so differences are paired. Criteria (fixed before the first run, never tuned):

* "matches": the mean over seeds of (recipe - bf16) validation loss lies within +-max(0.02
  nats, 2 x the standard deviation of the bf16 loss over seeds);
* NVFP4 "stays close": mean paired gap to bf16 <= 3% of the bf16 loss (NVIDIA report a gap
  of about 1-1.5% at 12B parameters; 3% allows for a model this small);
* an ablation "costs loss": mean paired increase over full NVFP4 > 0.

What the seeds can resolve: each claim is decided on the 95% t interval of the paired
differences over the seeds ([normlab.lab.replicates][]; one seed resolves nothing): PASS
when the interval lies inside the criterion, NOT REPRODUCED when it lies outside, and
INCONCLUSIVE when it straddles a limit, with the interval's half-width as the smallest
detectable effect (three seeds of this model resolve about 0.05-0.1 nats, more than the
losses the NVIDIA ablations report at scale).

Mechanism checks, which FAIL when broken
(`_lowp_mechanisms`): every run ends at least
0.2 nats below the unigram entropy (a recipe that learns nothing is a broken mechanism, not
a finding); stochastic rounding of the NVFP4 gradients is unbiased where nearest is not;
the random Hadamard transform spreads an injected outlier; 16x16 weight tiles give the same
quantised weight in the forward and the dgrad GEMM, 1x16 blocks do not.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import numpy as np

from normlab.lab.experiments._lowp_mechanisms import mechanism_checks
from normlab.lab.replicates import Criterion, Interval, judged, t_interval
from normlab.lab.result import (
    Check,
    ExperimentResult,
    ExperimentSkipped,
    NullProgress,
    Progress,
    Settings,
)
from normlab.lab.training import load_corpus, lr_at, sample_batch

__all__ = ["CONFIGS", "DETECTS", "NAME", "TITLE", "TORCH_HINT", "run"]

NAME = "lowp_training"
TITLE = "FP8, MXFP8 and NVFP4 training recipes vs bf16 (Micikevicius 2022; NVIDIA 2025)"
TORCH_HINT = 'pip install ".[torch]"  (from the normlab source tree)'
"""The install line the skipped experiment prints when PyTorch is missing."""
# breaks this experiment is known to turn into a FAIL (tests/torch/test_train_lab.py)
DETECTS = (
    "FP8 per-tensor dequantisation skipped (scale_inv not applied to the operands)",
    "NVFP4 gradients rounded to nearest where the recipe asks for stochastic rounding",
    "Hadamard matrix replaced by the identity (no spreading before rounding)",
    "NVFP4 weights quantised in 1x16 blocks where the recipe asks for 16x16 tiles",
)
CONFIGS = ("bf16", "fp8_delayed", "fp8_current", "fp8_rowwise", "mxfp8", "nvfp4",
           "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_no_2d")
"""The trained configurations: the bf16 baseline, the FP8 (delayed, current and row-wise
scaling), MXFP8 and NVFP4 recipes, and NVFP4 without stochastic rounding, without
the random Hadamard transform and without 16 x 16 weight blocks (the ablations). Row-wise
FP8 (torchao's recipe) is trained and plotted; no paper's claim is attached to it."""
_MATCH_FLOOR, _MATCH_SDS, _CLOSE_FRACTION, _ABLATION_SES = 0.02, 2.0, 0.03, 2.0
_PEAK_LR, _FINAL_LR = 1e-2, 0.1
_LEARNED_NATS = 0.2  # sanity: every run ends at least this far below the unigram entropy


def _learns(v: dict[str, np.ndarray], entropy: float) -> Check:
    """The mechanism check: a recipe that does not learn at all is a broken library."""
    worst = max(v, key=lambda k: float(v[k].max()))
    ok = all(float(a.max()) <= entropy - _LEARNED_NATS for a in v.values())
    return Check(
        source="sanity (every recipe trains)", claim="Every recipe trains the model beyond "
        "letter frequencies.",
        criterion=f"every run's validation loss <= unigram entropy - {_LEARNED_NATS} = "
        f"{entropy - _LEARNED_NATS:.3f} nats",
        measured=f"worst {worst} {_fmt(v[worst])}", passed=ok,
        values={"unigram_entropy": entropy})


def _recipe(name: str) -> Any:
    r = importlib.import_module("normlab.torch.recipes")
    return {
        "bf16": r.Bf16Recipe(), "fp8_delayed": r.Fp8DelayedRecipe(amax_history_len=16),
        "fp8_current": r.Fp8CurrentRecipe(), "fp8_rowwise": r.Fp8RowwiseRecipe(),
        "mxfp8": r.MXRecipe("e4m3"),
        "nvfp4": r.NVFP4Recipe(), "nvfp4_no_sr": r.NVFP4Recipe(stochastic_gradients=False),
        "nvfp4_no_rht": r.NVFP4Recipe(hadamard=False),
        "nvfp4_no_2d": r.NVFP4Recipe(two_d_weights=False),
    }[name]


def _sizes(settings: Settings, device: str) -> dict[str, int]:
    keys = ("steps", "seeds", "d", "layers", "heads", "context", "batch")
    if device != "cpu":  # a larger model where an accelerator makes it affordable
        values = settings.pick((300, 2, 128, 4, 4, 128, 32), (1500, 3, 256, 4, 4, 128, 32),
                               (3000, 5, 384, 6, 6, 256, 32))
    else:
        values = settings.pick((60, 1, 32, 2, 2, 32, 8), (100, 3, 32, 2, 2, 32, 8),
                               (400, 5, 64, 2, 4, 64, 16))
    return dict(zip(keys, values, strict=True))


def _model(torch: Any, vocab: int, sz: dict[str, int], seed: int, device: str) -> Any:
    """A pre-LN GPT: token + position embeddings, blocks, final LayerNorm, LM head."""
    nn, d = torch.nn, sz["d"]

    class Block(nn.Module):  # type: ignore[name-defined]  # torch is imported lazily
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape  # B,T,C
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, sz["heads"], -1).unbind(2)
            att = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))  # B,T,C
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(sz["context"], d)
            self.blocks = nn.Sequential(*[Block() for _ in range(sz["layers"])])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))  # B,T,V

    model = GPT().to(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():  # GPT-2 initialisation from this run's own generator
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def _train(name: str, corpus: Any, sz: dict[str, int], seed: int, device: str,
           progress: Progress) -> dict[str, Any]:
    torch = importlib.import_module("torch")
    convert = importlib.import_module("normlab.torch").convert
    bf16 = importlib.import_module("normlab.torch.recipes").Bf16Recipe()
    model = _model(torch, corpus.vocab, sz, seed, device)
    convert(model, {"head": bf16, "*": _recipe(name)})  # bf16 head operands in every run
    opt = torch.optim.AdamW(model.parameters(), lr=_PEAK_LR, betas=(0.9, 0.95),
                            weight_decay=0.0)
    train_ids, valid_ids = corpus.split()
    rng, curve = np.random.default_rng([seed, 7]), []
    for step in range(sz["steps"]):
        x, y = (torch.as_tensor(a, dtype=torch.long, device=device)
                for a in sample_batch(train_ids, sz["batch"], sz["context"], rng))  # B,T
        for group in opt.param_groups:
            group["lr"] = lr_at(step, _PEAK_LR, sz["steps"] // 10, sz["steps"], _FINAL_LR)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        curve.append(float(loss.detach()))
        progress.advance()
    model.eval()
    n = (valid_ids.size - 1) // sz["context"]
    vx = torch.as_tensor(valid_ids[: n * sz["context"]].reshape(n, -1), device=device)
    vy = torch.as_tensor(valid_ids[1: n * sz["context"] + 1].reshape(n, -1), device=device)
    with torch.no_grad():
        valid = torch.nn.functional.cross_entropy(model(vx.long()).flatten(0, 1),
                                                  vy.long().flatten())
    return {"train": curve, "valid": float(valid)}


def _gap(key: str, ref: str, v: dict[str, np.ndarray]) -> Interval:
    """The t interval of the paired validation-loss differences `key - ref` over the seeds."""
    return t_interval(v[key] - v[ref], f"validation loss of {key} minus {ref}, one seed "
                      "(the same initial weights and batches for both)")


def _matches(source: str, label: str, key: str, v: dict[str, np.ndarray]) -> Check:
    tol = max(_MATCH_FLOOR, _MATCH_SDS * float(np.std(v["bf16"], ddof=1))
              if v["bf16"].size > 1 else _MATCH_FLOOR)
    return judged(source, f"{label} training matches the 16-bit baseline's loss within "
                  f"run-to-run variation (tolerance max({_MATCH_FLOOR}, {_MATCH_SDS:g} sd of "
                  "bf16 over seeds)).", Criterion(low=-tol, high=tol), _gap(key, "bf16", v),
                  name="gap to bf16 (nats)", fmt=".4f",
                  measured=f"{key} {_fmt(v[key])} vs bf16 {_fmt(v['bf16'])}",
                  values={"tolerance": tol})


def _checks(v: dict[str, np.ndarray], entropy: float) -> list[Check]:
    """The claims whose configurations ran (all of them in a normal run)."""
    fp8 = "Micikevicius et al. 2022, section 4"
    checks = [_learns(v, entropy)] + [_matches(src, label, key, v) for src, label, key in (
        (fp8, "FP8 delayed-scaling", "fp8_delayed"), (fp8, "FP8 current-scaling", "fp8_current"),
        ("Rouhani et al. 2023, section 6", "MXFP8", "mxfp8")) if key in v]
    if "nvfp4" not in v:
        return checks
    limit = _CLOSE_FRACTION * float(v["bf16"].mean())
    checks.append(judged(
        "NVIDIA 2025, section 4", f"NVFP4 with its full recipe stays close to the "
        f"higher-precision baseline (within {_CLOSE_FRACTION:.0%} of the bf16 loss).",
        Criterion(high=limit), _gap("nvfp4", "bf16", v), name="gap to bf16 (nats)",
        fmt=".4f", measured=f"nvfp4 {_fmt(v['nvfp4'])}"))
    for key, what in (("nvfp4_no_sr", "stochastic rounding of gradients"),
                      ("nvfp4_no_rht", "the random Hadamard transform"),
                      ("nvfp4_no_2d", "2-D (16x16) weight blocks")):
        if key in v:
            checks.append(judged("NVIDIA 2025, section 5", f"Removing {what} from NVFP4 "
                                 "costs loss.", Criterion(low=0.0), _gap(key, "nvfp4", v),
                                 name="increase over full NVFP4 (nats)", fmt=".4f",
                                 measured=f"{key} {_fmt(v[key])}"))
    return checks


def _fmt(a: np.ndarray) -> str:
    return "/".join(f"{x:.3f}" for x in a)


def _plot(curves: dict[str, list[list[float]]]) -> Any:
    from normlab.lab.plotting import new_figure

    fig, ax = new_figure(width=7.5, height=4.6)
    for key, runs in curves.items():
        c = np.convolve(np.asarray(runs[0]), np.ones(10) / 10, mode="valid")
        ax.plot(np.arange(c.size) + 10, c, lw=1.2, label=key)
    ax.set(xlabel="step", ylabel="training loss (nats/char, 10-step mean)",
           title="Character LM, first seed of each recipe")
    ax.legend(fontsize=8)
    return fig


def default_device() -> str:
    """`"cuda"` when torch sees a GPU, else `"cpu"`."""
    torch = importlib.import_module("torch")
    return "cuda" if torch.cuda.is_available() else "cpu"


def run(settings: Settings, progress: Progress, *, device: str | None = None) -> ExperimentResult:
    """Train every configuration of `CONFIGS` over several seeds; judge the claims."""
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("normlab.torch")  # raises for a torch older than it supports
    except ImportError as exc:
        raise ExperimentSkipped(f"lowp_training needs PyTorch: {TORCH_HINT} ({exc})") from exc
    dev = device or default_device()
    sz, corpus = _sizes(settings, dev), load_corpus()
    # disjoint per seed; mod 2**64 keeps every --seed a valid torch seed
    seeds = [(settings.seed * sz["seeds"] + k) % 2**64 for k in range(sz["seeds"])]
    progress.start(len(CONFIGS) * len(seeds) * sz["steps"], "low-precision recipes")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small products: extra threads only wait on each other
    try:
        runs = {key: [_train(key, corpus, sz, s, dev, progress) for s in seeds]
                for key in CONFIGS}
    finally:
        torch.set_num_threads(threads)
    v = {key: np.array([r["valid"] for r in rs]) for key, rs in runs.items()}
    sde = {f"{k} - {ref}": _gap(k, ref, v).half_width for k in v
           for ref in (("nvfp4",) if k.startswith("nvfp4_") else ("bf16",)) if k != ref}
    finite = [x for x in sde.values() if np.isfinite(x)]
    resolves = (f"the paired differences over {len(seeds)} seeds resolve effects above "
                f"{min(finite):.3f}-{max(finite):.3f} nats (half-width of the 95% t interval)"
                if finite else "one seed resolves no paired difference (interval infinite)")
    p = np.bincount(corpus.split()[0]) / corpus.split()[0].size
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())  # nats: letter frequencies only
    rows = ["| recipe | validation loss per seed | mean gap to bf16 |", "|---|---|---|"]
    rows += [f"| {k} | {_fmt(v[k])} | {float((v[k] - v['bf16']).mean()):+.4f} |" for k in v]
    summary = (
        f"A {sz['layers']}-layer pre-LN character Transformer (width {sz['d']}, {sz['heads']} "
        f"heads, context {sz['context']}, batch {sz['batch']}) trained {sz['steps']} AdamW "
        f"steps (peak lr {_PEAK_LR:g}, warmup 10%, linear decay to {_FINAL_LR:g}) on {dev}, "
        f"seeds {seeds}, with each recipe in every block Linear (LM head bf16): {resolves}. "
        "The mechanism checks (stochastic rounding, Hadamard transform, 16x16 tiles) "
        "measure the recipe's parts directly."
    )
    checks = _checks(v, entropy) + mechanism_checks(settings.seed)
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks,
        figures={"loss_curves": _plot({k: [r["train"] for r in rs] for k, rs in runs.items()})},
        tables=["\n".join(rows)],
        metrics={"valid_loss": {k: a.tolist() for k, a in v.items()},
                 "smallest_detectable_effect": sde},
        settings={**sz, "device": dev, "seeds": seeds, "peak_lr": _PEAK_LR,
                  "optimizer": "torch.optim.AdamW betas 0.9/0.95, no weight decay, fp32 "
                  "master weights", "init": "N(0, 0.02) weights, zero biases (GPT-2)",
                  "schedule": f"warmup 10%, linear decay to {_FINAL_LR:g} of the peak",
                  "configs": list(CONFIGS)})


def main(argv: list[str] | None = None) -> int:
    """`python -m normlab.lab.experiments.lowp_training [--device cuda] [--size ...]`."""
    p = argparse.ArgumentParser(description=TITLE)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--size", default="default", choices=("quick", "default", "full"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    res = run(Settings(args.size, args.seed), NullProgress(), device=args.device)
    print(res.summary, "\n\n" + res.tables[0] + "\n")
    for c in res.checks:
        print(f"[{c.verdict}] {c.claim} -- {c.measured}")
    return 1 if res.verdict == "FAIL" else 0


if __name__ == "__main__":
    raise SystemExit(main())
