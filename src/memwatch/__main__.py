"""``python -m memwatch``: same as the ``memwatch`` console script."""
from memwatch.cli import main

raise SystemExit(main())
