"""What an experiment ran, read back from metrics.json, against what its docstring and the
README say it runs (optimiser, initialisation, sizes, criteria).

Each experiment records its configuration in ``ExperimentResult.settings`` (metrics.json:
``experiments.<name>.sizes``), with the initialisation measured on the arrays of the model
that was built. The report is written from the session's quick results (figures left out)
and the recorded values are compared with the prose a reader sees.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from normlab.lab.experiments import load
from normlab.lab.report import write_report
from normlab.lab.result import Settings
from normlab.lab.runner import Outcome

NAMES = ("training_stability", "xiong_gradients", "residual_depth", "loss_scaling",
         "norm_speed")
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def recorded(quick_results, tmp_path_factory) -> dict:
    outcomes = []
    for name in NAMES:  # a copy without figures: the shared results keep theirs
        result = dataclasses.replace(quick_results[name], figures={})
        outcomes.append(Outcome(name, result.title, result.verdict.lower(), 0.0, result=result))
    files = write_report(outcomes, tmp_path_factory.mktemp("configs"), Settings("quick", 0),
                         total_s=0.0)
    data = json.loads(files.metrics.read_text(encoding="utf-8"))
    return {name: data["experiments"][name]["sizes"] for name in NAMES}


def _doc(name: str) -> str:
    return " ".join((load(name).__doc__ or "").split())  # one line: prose wraps anywhere


def _readme_row(name: str) -> str:
    (row,) = [line for line in README.read_text(encoding="utf-8").splitlines()
              if re.match(rf"\| \d+ \| `{name}`", line)]
    return row


def test_training_stability_ran_the_documented_model_and_optimizer(recorded):
    cfg, doc, row = recorded["training_stability"], _doc("training_stability"), _readme_row(
        "training_stability")
    assert cfg["optimizer"] == "AdamW betas 0.9/0.98, no weight decay"
    assert "AdamW with betas 0.9/0.98 and no weight decay" in doc and "AdamW 0.9/0.98" in row
    assert f"PEAK_LR = {cfg['peak_lr']:g}" in doc
    assert f"{cfg['heads']} heads" in doc and cfg["d_ff"] == 2 * cfg["d"]
    init = cfg["init_measured"]  # measured on the built model: 5-8% (sampling of the std)
    assert abs(init["token_input_std"] - 1) < 0.08 and init["head_tied_to_token_table"]
    assert abs(init["linear_std_over_xavier"] - 1) < 0.05 and init["max_abs_bias"] == 0.0
    for words in ("Xavier-normal weights", "zero biases", "head tied"):
        assert words in doc, words
    assert "Xavier" in row and "tied head" in row


def test_xiong_gradients_ran_the_documented_model(recorded):
    cfg, doc, row = recorded["xiong_gradients"], _doc("xiong_gradients"), _readme_row(
        "xiong_gradients")
    assert f"{cfg['layers']} layers" in doc and f"{cfg['layers']} layers" in row
    assert f"{cfg['heads']} heads" in doc and cfg["attention"] == "causal" and "causal" in doc
    assert cfg["init_measured"]["head_tied_to_token_table"] and "W1 and W2" in row
    # the paper's ten seeds at the default size, as the README says
    assert load("xiong_gradients")._sizes(Settings("default", 0))["seeds"] == 10
    assert "10 seeds" in row


def test_residual_depth_judges_an_sgd_step_on_the_weight_matrices(recorded):
    cfg, doc, row = recorded["residual_depth"], _doc("residual_depth"), _readme_row(
        "residual_depth")
    exp = load("residual_depth")
    assert cfg["update_step"] == f"SGD lr {exp.LR_SGD:g} on the weight matrices only (judged)"
    assert "one plain SGD step (lr LR_SGD) on the sub-layers' weight matrices only" in doc
    assert f"SGD step (lr {exp.LR_SGD:.0e})".replace("e-05", "e-5") in row
    assert cfg["extension_step"].startswith(f"AdamW lr {exp.LR_ADAM:g}") and "AdamW" in row


def test_loss_scaling_ran_adam_on_a_mean_over_many_outputs(recorded):
    cfg, doc, row = recorded["loss_scaling"], _doc("loss_scaling"), _readme_row("loss_scaling")
    assert cfg["optimizer"].startswith("AdamW (Adam)") and "full batch" in cfg["optimizer"]
    assert "full-batch Adam" in doc and "Adam" in row and "SGD" not in row
    assert abs(cfg["init_measured"]["std_over_he"] - 1) < 0.05  # He: N(0, 2 / fan_in)
    assert cfg["init_measured"]["max_abs_bias"] == 0.0 and "He-initialised" in doc
    quick = int(math.log2(cfg["outputs_total"]))  # the sizes the docstring states
    default = load("loss_scaling")._sizes(Settings("default", 0))
    assert f"$2^{{{quick}}}$ at `--quick`" in doc
    n_default = int(math.log2(default["batch"] * default["outputs"]))
    assert f"$2^{{{n_default}}}$ at the default size" in doc and f"2^{n_default}" in row
    # GELU, read off the network that ran (ReLU's kinks made the fp16 and fp32 runs part ways)
    assert cfg["hidden_layers"] == 2 and "two GELU hidden layers" in doc
    assert cfg["activation"] == "GELU"


def test_norm_speed_records_its_repeats(recorded):
    cfg, doc, row = recorded["norm_speed"], _doc("norm_speed"), _readme_row("norm_speed")
    from normlab.lab.experiments._checked import CHECKED

    words = "order-statistic interval"  # the docstring and the lab tables' cell agree
    assert cfg["repeats"] == 15 and words in doc and words in CHECKED["norm_speed"]
    assert row.startswith("| ")  # the README's row exists (its cell comes from CHECKED)
    assert np.all(np.array(cfg["backends"][:1]) == ["numpy"])
