"""Each piece of recipe arithmetic is written once: its code marks appear in one file.

The marks are the code (strings and comments blanked) that a restatement of the piece
cannot avoid: the overflow replacement of a scale, the 2^-127 floor, the mantissa mask of
power-of-two scales, the roll of an amax history, the element format's top exponent in the
MX rule, NVFP4's 448 x 6 and 1/6, the blockwise scale function and the tiling functions.
The numba kernels (an optimisation behind the NumPy reference) are not counted.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import normlab

PIECES = {  # piece -> (mark, the one file allowed to hold it)
    "scale from amax": (r"isinf\(\s*(s|scale)\s*\)", "precision/scaled/scales.py"),
    "2^-127 floor": (r"2\.0\s*\*\*\s*-127", "precision/scaled/scales.py"),
    "power-of-two scales": (r"0xFF800000|-\(2\s*\*\*\s*23\)|-\(1\s*<<\s*23\)",
                            "precision/scaled/scales.py"),
    "delayed update": (r"\broll\(|\b_rolled\(", "precision/scaled/scales.py"),
    "MX shared exponent": (r"\bemax_elem\b|\belem_format\.emax\b|\b_elem_emax\b",
                           "precision/scaled/block_scales.py"),
    "NVFP4 two-level scales": (r"448\.0\s*\*\s*6\.0|\b2688\b|1\.0\s*/\s*6\.0",
                               "precision/scaled/block_scales.py"),
    "blockwise scales": (r"def\s+block(wise)?_scales\b", "precision/scaled/block_scales.py"),
    "block tiling": (r"def\s+(_tiles|tile|_blocked|_unblocked|_block_amax|block_amax|_spread|"
                     r"spread|expand|multiply_blocks)\b", "precision/scaled/tiling.py"),
}


def code_of(text: str) -> str:
    """`text` with every string literal and comment blanked (line structure kept)."""
    lines = [list(line) for line in text.splitlines(keepends=True)]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                row = lines[r - 1]
                for c in range(c0 if r == r0 else 0, c1 if r == r1 else len(row)):
                    if row[c] != "\n":
                        row[c] = " "
    return "".join("".join(line) for line in lines)


def definitions(root: Path) -> dict[str, list[str]]:
    """piece -> the files under `root` (kernels excluded) whose code holds its mark."""
    files = {p.relative_to(root).as_posix(): code_of(p.read_text(encoding="utf-8"))
             for p in root.rglob("*.py") if "kernels" not in p.relative_to(root).parts}
    return {piece: sorted(f for f, code in files.items() if re.search(mark, code))
            for piece, (mark, _) in PIECES.items()}


def test_every_piece_has_one_definition() -> None:
    found = definitions(Path(normlab.__file__).resolve().parent)
    assert found == {piece: [home] for piece, (_, home) in PIECES.items()}


def test_a_second_copy_is_found(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "copy.py").write_text(
        '"""isinf(s) in a docstring does not count."""\n'
        "def f(s):\n    return torch.where(torch.isinf(s), 0, s)  # isinf(scale)\n")
    (tmp_path / "torch" / "note.py").write_text("# torch.roll(h, -1)\nx = 'roll('\n")
    found = definitions(tmp_path)
    assert found["scale from amax"] == ["torch/copy.py"] and found["delayed update"] == []
