"""``python -m kvoffload``: the ``kvoffload`` command."""

from __future__ import annotations

import sys

from kvoffload.cli.main import main

sys.exit(main())
