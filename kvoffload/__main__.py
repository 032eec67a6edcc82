"""``python -m kvoffload``: see :mod:`kvoffload.cli`."""

from kvoffload.cli import main

raise SystemExit(main())
