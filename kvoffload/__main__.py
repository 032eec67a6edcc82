"""``python -m kvoffload``: see :mod:`kvoffload.app.cli`."""

from kvoffload.app.cli import main

raise SystemExit(main())
