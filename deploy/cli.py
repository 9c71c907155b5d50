"""Subcommands of the ``jobwheel`` CLI that belong to ``deploy``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
