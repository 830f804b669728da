"""`python -m normlab.bench`: the same as `normlab bench`."""

from __future__ import annotations

import sys

from normlab.bench.command import main

sys.exit(main())
