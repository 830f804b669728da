"""Float formats, exact rounding, loss scaling, mixed-precision training, fp8 and MX scaling."""

from __future__ import annotations

__all__: list[str] = []

# --- formats, rounding, codes, chapter listings (owner: formats) ---

# --- scaling and training (owner: scaling) ---
