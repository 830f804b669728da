"""A planted pathology, one huge activation channel, is what the inspector ranks worst.

An MLP `up -> GELU -> spike -> down -> GELU -> head` where `spike` multiplies channel 7 by
2^20, so the input of `down` holds one channel about a million times larger than the rest.
Under per-tensor FP8 (current scaling) the scale follows that channel and the other values
fall below E4M3's smallest subnormal relative to it: nearly all of `down`'s input
underflows, and the report's ranking (`normlab.lab.inspect_log`) puts it first and flags
`down`. A block recipe confines the damage to the blocks that hold the channel: under MX
(32-element blocks along K = 64) and blockwise FP8 with 16-element blocks, the lost fraction
of the same operand is smaller, which the criterion checks with a margin: less than half of
FP8's.

The recommendation is Python: executed on a fresh model, its `convert` call leaves the
flagged layers (`down`; and `up`, whose output gradient carries the channel, multiplied by
the same gain on the way back) as `nn.Linear` and converts the others.
"""

from __future__ import annotations

import pytest
import torch

import normlab.torch as nt

pytest.importorskip("matplotlib")

from normlab.lab.inspect_log import flagged, ranked, recommendation, summarise
from normlab.lab.inspect_report import write_report

FP8 = nt.Fp8CurrentRecipe()
BLOCKS = [nt.MXRecipe(), nt.BlockwiseFp8Recipe(block_size=16)]


class Spike(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = torch.ones(x.shape[-1])
        gain[7] = 2.0**20
        return x * gain


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential()
    for name, m in (("up", torch.nn.Linear(64, 64)), ("act", torch.nn.GELU()), ("spike", Spike()),
                    ("down", torch.nn.Linear(64, 64)), ("act2", torch.nn.GELU()),
                    ("head", torch.nn.Linear(64, 8))):
        net.add_module(name, m)
    return net


@pytest.fixture(scope="module")
def records() -> list[dict]:
    net = _model()
    g = torch.Generator().manual_seed(1)
    with nt.inspect(net, [FP8, *BLOCKS]) as log:
        for _ in range(3):
            net(torch.randn(32, 64, generator=g)).pow(2).mean().backward()
            log.step()
    return log.records


def _only(summaries, recipe):
    return [s for s in summaries if s.recipe == repr(recipe)]


def test_the_huge_channel_is_ranked_worst_under_per_tensor_fp8(records):
    worst, _ = ranked(_only(summarise(records), FP8))[0]
    assert (worst.module, worst.tensor) == ("down", "input")
    assert worst.underflow > 0.5
    assert "down" in flagged(summarise(records))[repr(FP8)]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda r: type(r).__name__)
def test_a_block_recipe_loses_less_of_it(records, block):
    summaries = summarise(records)
    pick = {s.recipe: s for s in summaries if (s.module, s.tensor) == ("down", "input")}
    assert pick[repr(block)].lost < 0.5 * pick[repr(FP8)].lost


def test_the_recommendation_runs_and_keeps_the_layer(records):
    keep = flagged(summarise(records))[repr(FP8)]
    source = recommendation(repr(FP8), keep)
    model = _model()
    exec(source, {"model": model})  # the printed mapping, pasted as it is
    assert "down" in keep and len(keep) < 3  # `up` is flagged too: its dy has the channel
    for name in ("up", "down", "head"):
        layer = getattr(model, name)
        assert (type(layer) is torch.nn.Linear) == (name in keep), name
        assert isinstance(layer, nt.QuantLinear) == (name not in keep), name


def test_report_is_written(records, tmp_path):
    recs = write_report(records, tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("<img ") == 1 + 3 * 3  # the comparison, 3 heatmaps per recipe
    assert "down" in recs[repr(FP8)]
    csv_rows = (tmp_path / "out" / "worst_layers.csv").read_text().splitlines()
    assert csv_rows[1].startswith("down,input,")
