"""``python -m memwatch``: the ``memwatch`` command line (same as the console script)."""
from memwatch.cli import main

raise SystemExit(main())
