"""Fused, multi-threaded numba kernels behind the functional API (optional).

The public functions reach these kernels only through `normlab._backend.kernel`,
whose table `KERNELS` names each op's `"module:function"`; the kernels import nothing
from the dispatch point. Importing this package raises `ImportError` when numba is
missing, and the dispatch point then keeps the NumPy references: nothing outside this
package imports numba.

Files: `<op>.py` is the adapter (validated arguments in, the reference's result types
out, `NotImplemented` to decline) and `<op>_jit.py` holds its compiled loops;
`normlab.kernels._adapt` holds the launch policy (serial or parallel, fork and thread
safety) and the array plumbing every adapter shares. Every loop is compiled with
`cache=True` (machine code cached on disk next to the sources, or under
`NUMBA_CACHE_DIR`), once with `parallel=True` and once serially; results do not depend
on which runs or on the thread count.
"""

from __future__ import annotations

import numba  # noqa: F401  (ImportError here means: no kernels, references only)

__all__: list[str] = []  # nothing to import from here: the kernels serve through dispatch
