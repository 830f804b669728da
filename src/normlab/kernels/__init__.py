"""Fused, multi-threaded numba kernels behind the functional API (optional).

Importing this package registers its kernels with :func:`normlab._backend.register`; the
public functions reach them only through :func:`normlab._backend.kernel`. The import
raises ``ImportError`` when numba is missing, and the dispatch point then keeps the NumPy
references: nothing outside this package imports numba.

Files: ``<op>.py`` is the adapter (validated arguments in, the reference's result types
out, ``NotImplemented`` to decline) and ``<op>_jit.py`` holds its compiled loops;
:mod:`normlab.kernels._adapt` holds the launch policy (serial or parallel, fork and thread
safety) and the array plumbing every adapter shares. Every loop is compiled with
``cache=True`` (machine code cached on disk next to the sources, or under
``NUMBA_CACHE_DIR``), once with ``parallel=True`` and once serially; results do not depend
on which runs or on the thread count.
"""

from __future__ import annotations

import numba  # noqa: F401  (ImportError here means: no kernels, references only)

from normlab.kernels import (
    batch_norm,  # noqa: F401  (registers the BatchNorm kernels)
    block_scale,  # noqa: F401  (registers block_amax)
    dropout,  # noqa: F401  (registers inverted dropout)
    group_norm,  # noqa: F401  (registers the GroupNorm kernels)
    quantize,  # noqa: F401  (registers quantize)
    row_norms,  # noqa: F401  (registers the LayerNorm / RMSNorm / add+norm kernels)
)

__all__: list[str] = []  # nothing to import from here: the kernels serve through dispatch
