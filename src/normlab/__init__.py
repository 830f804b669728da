"""normlab: normalization, residual streams, dropout and low-precision arithmetic.

The functional core (``*_forward`` / ``*_backward`` pairs) is re-exported here; layers live
in :mod:`normlab.nn`, float formats and mixed precision in :mod:`normlab.precision`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
