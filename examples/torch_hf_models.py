"""normlab with a Hugging Face model: GPT-2 built on the meta device, converted, initialised,
trained (with activation checkpointing too: the same losses, bit for bit), evaluated in high
precision, saved and loaded back, and unconverted.

Run: python examples/torch_hf_models.py  (CPU; needs transformers; the model is a tiny one
built from a config, nothing is downloaded; measured: 21 s of CPU time, 39 s wall on 2 CPU
cores shared with other jobs at a load average of 6 to 7)
"""

import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers.pytorch_utils import Conv1D

from normlab.torch import Fp8DelayedRecipe, QuantConv1D, convert, no_quantization, unconvert

transformers.utils.logging.set_verbosity_error()  # no load reports in this example's output
transformers.utils.logging.disable_progress_bar()

CONFIG = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                 n_positions=64, bos_token_id=0, eos_token_id=0)
RECIPE = Fp8DelayedRecipe(amax_history_len=16)


def batch(step: int) -> torch.Tensor:
    # a learnable sequence: each token is the previous one plus 3 (mod 128)
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, 128, (8, 1), generator=g)
    return (start + 3 * torch.arange(32)) % 128  # B,T


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def build(verbose: bool = False) -> torch.nn.Module:
    # build without memory, convert, then materialise and initialise as Hugging Face does
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(CONFIG)
    model, summary = convert(model, RECIPE, return_summary=True)
    if verbose:
        print(str(summary).splitlines()[0])
        print("left alone:", summary.left_alone)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()  # QuantLinear is a torch.nn.Linear: initialised like one
    assert isinstance(model.transformer.h[0].attn.c_attn, QuantConv1D)
    return model


def train(model: torch.nn.Module) -> list[torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in range(15):
        loss = loss_of(model, batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def main() -> int:
    # 1. meta device, convert, initialise
    model = build(verbose=True)

    # 2. train a few steps with FP8 delayed scaling
    losses = train(model)
    trained = float(losses[-1])
    print(f"trained: loss {trained:.3f} (ln 128 = 4.852 at the start)")
    assert trained < 4.0

    # 2b. again with activation checkpointing: the recomputed forwards change nothing
    again = build()
    again.activation_checkpointing_enable()  # gradient_checkpointing_enable before v5
    assert all(torch.equal(a, b) for a, b in zip(losses, train(again), strict=True))
    print("activation checkpointing: the same 15 losses, bit for bit")

    # 3. evaluate: quantised, and in high precision (no amax recorded, scales unchanged)
    model.eval()
    scales = model.transformer.h[0].mlp.c_fc.scale.clone()
    with torch.no_grad():
        fp8 = float(loss_of(model, batch(1000)))
        with no_quantization():
            high = float(loss_of(model, batch(1000)))
    assert torch.equal(model.transformer.h[0].mlp.c_fc.scale, scales)
    print(f"eval loss: fp8 {fp8:.3f}, high precision {high:.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        # 4. save_pretrained keeps Conv1D's layout; the recipe state is saved as one tensor
        model.save_pretrained(tmp)
        plain = transformers.GPT2LMHeadModel.from_pretrained(tmp)  # an unconverted GPT-2
        assert type(plain.transformer.h[0].attn.c_attn) is Conv1D
        plain.eval()
        with torch.no_grad(), no_quantization():
            assert float(loss_of(plain, batch(1000))) == high
        # 5. converted again, the saved recipe state loads from the same file
        convert(plain, RECIPE)
        plain.load_state_dict(load_file(Path(tmp) / "model.safetensors"), strict=False)
        with torch.no_grad():
            assert float(loss_of(plain, batch(1000))) == fp8
        print("save_pretrained / from_pretrained: same losses, quantised and not")

    # 6. the way back: the classes convert replaced, with the same parameters
    weight = model.transformer.h[0].attn.c_attn.weight
    unconvert(model)
    assert type(model.transformer.h[0].attn.c_attn) is Conv1D
    assert model.transformer.h[0].attn.c_attn.weight is weight
    print("unconvert: Conv1D layers back, same Parameter objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
