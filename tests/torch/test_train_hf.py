"""Hugging Face models: GPT-2's Conv1D, save_pretrained / from_pretrained, meta-device init
with `init_weights`, and tiny GPT-2 and Llama models training with every recipe.

The models are built from small configs with random weights (no download). Expected values
come from the unconverted model (the same parameters through the same operations: compared
exactly) and from the model before saving (bit-identical after the round trip). Training is
checked for finite losses only: a few steps on random tokens say that every recipe runs end to
end in a real model, not how well it learns.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from transformers.pytorch_utils import Conv1D  # noqa: E402

from normlab.torch import (  # noqa: E402
    QuantConv1D,
    QuantLinear,
    convert,
    no_quantization,
    unconvert,
)
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)

RECIPES = {
    "bf16": Bf16Recipe(),
    "delayed": Fp8DelayedRecipe(amax_history_len=4),
    "current": Fp8CurrentRecipe(),
    "mx": MXRecipe(),
    "nvfp4": NVFP4Recipe(),
    "blockwise": BlockwiseFp8Recipe(block_size=32),
}
VOCAB = 64


def _gpt2(seed: int = 0) -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg)


def _llama_config() -> object:
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1,
                                    vocab_size=VOCAB, max_position_embeddings=32,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(_llama_config())


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


def _train(model: torch.nn.Module, steps: int = 3) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        ids = _ids(step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_gpt2_conv1d_layers_are_converted_in_their_own_layout() -> None:
    model = _gpt2()
    plain = _gpt2()
    before = {k: v.shape for k, v in model.state_dict().items()}
    attn = model.transformer.h[0].attn
    weight = attn.c_attn.weight
    model, summary = convert(model, Fp8DelayedRecipe(amax_history_len=4), return_summary=True)
    assert isinstance(attn.c_attn, QuantConv1D) and attn.c_attn.weight is weight
    assert sum(isinstance(m, QuantConv1D) for m in model.modules()) == 8
    assert set(summary.left_alone) == {"lm_head"}  # the tied head stays high precision
    after = {k: v.shape for k, v in model.state_dict().items() if "_extra_state" not in k}
    assert after == before
    model.eval()
    plain.eval()
    with torch.no_grad(), no_quantization():  # exactly Conv1D's and Linear's arithmetic
        assert torch.equal(model(input_ids=_ids()).logits, plain(input_ids=_ids()).logits)
    with torch.no_grad():
        assert not torch.equal(model(input_ids=_ids()).logits, plain(input_ids=_ids()).logits)
    unconvert(model)
    assert type(attn.c_attn) is Conv1D and attn.c_attn.weight is weight
    assert {k: v.shape for k, v in model.state_dict().items()} == before


def test_save_pretrained_from_pretrained_round_trip(tmp_path) -> None:
    recipe = Fp8DelayedRecipe(amax_history_len=4)
    model = convert(_gpt2(), recipe)
    _train(model, 2)
    model.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)  # a plain model
    assert type(loaded.transformer.h[0].mlp.c_fc) is Conv1D
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    # converted again, the saved recipe state loads back from the same file
    convert(loaded, recipe)
    saved = safetensors_torch.load_file(tmp_path / "model.safetensors")
    result = loaded.load_state_dict(saved, strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == ["lm_head.weight"]  # tied
    for a, b in zip(model.modules(), loaded.modules(), strict=True):
        if isinstance(a, QuantLinear):
            assert torch.equal(a.get_extra_state(), b.get_extra_state())
    model.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=_ids(5)).logits, loaded(input_ids=_ids(5)).logits)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_meta_device_init_weights_gives_finite_losses(family: str) -> None:
    with torch.device("meta"):
        model = _gpt2() if family == "gpt2" else _llama()
    convert(model, Fp8DelayedRecipe(amax_history_len=4))
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers
    for layer in layers:  # initialised by Hugging Face (normal, std 0.02), not left empty
        assert float(layer.weight.detach().abs().max()) < 0.2
        assert torch.equal(layer.scale, torch.ones(3))
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_models_train_with_every_recipe(family: str, name: str) -> None:
    model = convert(_gpt2() if family == "gpt2" else _llama(), RECIPES[name])
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) >= 8
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses))), losses
