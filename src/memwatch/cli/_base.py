"""What every ``memwatch`` command is: a class whose docstring is its help."""

from __future__ import annotations

import argparse
from typing import ClassVar


class Command:
    """Base of the command classes (one per file in ``memwatch.cli``)."""

    name: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's arguments."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the work; return the exit code. Raise BundleError for bad input (exit code 2)."""
        raise NotImplementedError
