"""The numerics inspector on the lab's tiny transformer under NVFP4: which layers to keep in bf16.

1. Train the lab's character GPT (pre-LN, 2 blocks, width 32) in its own precision while
   `normlab.torch.inspect` judges copies of every linear layer's operands under NVFP4
   (shadow mode: the training itself is untouched), logging every 5th step.
2. Read the log as `normlab inspect` does: the worst operands and the layers it flags.
3. Train the same initial model twice under NVFP4: every layer converted, and with the
   flagged layers kept in high precision (the recommended `convert` mapping); compare the
   validation losses.

Run: python examples/inspect_nvfp4.py  (CPU is enough; about a minute on a busy 2-core
machine). The report with figures: normlab inspect <the log> --out inspect-report
"""

import os
import tempfile

import numpy as np
import torch

from normlab.lab.inspect_log import flagged, ranked, read_log, recommendation, summarise
from normlab.lab.training import load_corpus, sample_batch
from normlab.torch import NVFP4Recipe, convert, inspect

D, LAYERS, HEADS, CONTEXT, BATCH, STEPS = 32, 2, 2, 32, 8, 60


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # B,T,C
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, -1).unbind(2)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, D))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, D), torch.nn.Embedding(CONTEXT, D)
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1])
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))  # B,T,V


def make_model(vocab: int) -> GPT:
    torch.manual_seed(0)
    model = GPT(vocab)
    with torch.no_grad():  # GPT-2 initialisation, as the lab's experiment
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model


def train(model: torch.nn.Module, corpus, log=None) -> float:
    """STEPS AdamW steps on the same batches for every model; the validation loss."""
    train_ids, valid_ids = corpus.split()
    rng = np.random.default_rng(7)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(STEPS):
        x, y = (torch.as_tensor(a, dtype=torch.long)
                for a in sample_batch(train_ids, BATCH, CONTEXT, rng))  # B,T
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log is not None:
            log.step()
    n = (valid_ids.size - 1) // CONTEXT
    vx = torch.as_tensor(valid_ids[: n * CONTEXT].reshape(n, -1), dtype=torch.long)
    vy = torch.as_tensor(valid_ids[1: n * CONTEXT + 1].reshape(n, -1), dtype=torch.long)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(vx).flatten(0, 1), vy.flatten()))


def main() -> None:
    torch.set_num_threads(1)
    corpus = load_corpus()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nvfp4.jsonl")
        model = make_model(corpus.vocab)
        with inspect(model, NVFP4Recipe(), every=5, path=path) as log:
            plain = train(model, corpus, log)
        records = read_log(path)  # what `normlab inspect` reads
    summaries = summarise(records)
    print(f"{len(records)} records; the worst operands under NVFP4:")
    for s, short in ranked(summaries)[:5]:
        print(f"  {s.module:16s} {s.tensor:12s} lost {100 * s.lost:5.1f}%  "
              f"SQNR {s.sqnr_db:5.1f} dB ({short:.1f} dB below typical)")
    recipe = repr(NVFP4Recipe())
    keep = flagged(summaries)[recipe]
    print("\nrecommended mapping:\n" + recommendation(recipe, keep))

    everything = convert(make_model(corpus.vocab), NVFP4Recipe(), keep_lm_head=False)
    mapping = {**{name: None for name in keep}, "*": NVFP4Recipe()}
    kept = convert(make_model(corpus.vocab), mapping, keep_lm_head=False)
    print(f"\nvalidation loss after {STEPS} steps:")
    print(f"  float32 (the inspected run, unchanged by it)  {plain:.4f}")
    print(f"  NVFP4 everywhere                              {train(everything, corpus):.4f}")
    print(f"  NVFP4, flagged layers kept in float32         {train(kept, corpus):.4f}")


if __name__ == "__main__":
    main()
