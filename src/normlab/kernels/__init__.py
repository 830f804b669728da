"""Fused, multi-threaded numba kernels behind the functional API (optional).

Importing this package registers its kernels with :func:`normlab._backend.register`; the
public functions reach them only through :func:`normlab._backend.kernel`. The import
raises ``ImportError`` when numba is missing, and the dispatch point then keeps the NumPy
references: nothing outside this package imports numba.

Every kernel is compiled with ``cache=True`` (machine code cached on disk next to the
sources, so a second process does not recompile) and ``parallel=True`` (one ``prange``
over rows, features or elements); results do not depend on the thread count.
"""

from __future__ import annotations

import numba  # noqa: F401  (ImportError here means: no kernels, references only)

from normlab.kernels import (
    _batch_norm,  # noqa: F401  (registers the BatchNorm kernels)
    _block_scale,  # noqa: F401  (registers block_amax)
    _dropout,  # noqa: F401  (registers inverted dropout)
    _norms,  # noqa: F401  (registers the norm kernels)
    _quantize,  # noqa: F401  (registers quantize)
)

__all__: list[str] = []
