"""``normlab formats`` and ``normlab bits``: the new formats, --rounding, --saturate, NaN note."""

from __future__ import annotations

import pytest

from normlab.cli import main


def test_formats_lists_fnuz_and_the_block_recipes(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "fnuz"):
        assert name in out
    for recipe in ("nvfp4_quantize", "blockwise_quantize", "MXINT8", "mx_quantize"):
        assert recipe in out
    assert "240" in out  # e4m3fnuz max


def test_bits_says_when_a_value_rounds_to_nan(capsys):
    assert main(["bits", "500", "--format", "e4m3"]) == 0
    out = capsys.readouterr().out
    assert "code 0x7f" in out and "(not representable: rounds to NaN)" in out
    assert main(["bits", "500", "--format", "e4m3", "--saturate"]) == 0
    out = capsys.readouterr().out
    assert "code 0x7e" in out and "rounds to 448.0" in out and "NaN)" not in out
    assert main(["bits", "nan", "--format", "e4m3"]) == 0
    assert "not representable" not in capsys.readouterr().out  # NaN in, NaN out


@pytest.mark.parametrize(("mode", "code", "value"), [
    ("nearest", "0x38", "1.0"), ("toward_positive", "0x39", "1.125"),
    ("toward_negative", "0x38", "1.0"), ("nearest_away", "0x38", "1.0"),
])
def test_bits_rounding_modes(capsys, mode, code, value):
    # 1.01 in E4M3 lies between 1.0 (0x38) and 1.125 (0x39), nearer 1.0
    assert main(["bits", "1.01", "--format", "e4m3", "--rounding", mode]) == 0
    out = capsys.readouterr().out
    assert f"code {code}" in out and f"rounds to {value}" in out


def test_bits_fnuz_nan_code_and_bad_mode(capsys):
    assert main(["bits", "300", "--format", "e4m3fnuz"]) == 0
    out = capsys.readouterr().out
    assert "code 0x80" in out and "rounds to NaN" in out
    # a usage error: one line on stderr, exit status 2 (main returns it instead of exiting)
    assert main(["bits", "1", "--format", "e4m3", "--rounding", "stochastic"]) == 2
    assert "invalid choice" in capsys.readouterr().err
