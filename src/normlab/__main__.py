"""`python -m normlab` is the `normlab` command."""

from __future__ import annotations

import sys

from normlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
