"""``python -m memwatch.cli``: same as the ``memwatch`` console script."""

import sys

from memwatch.cli import main

sys.exit(main())
