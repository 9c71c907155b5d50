"""Subcommands of the ``jobwheel`` CLI for ``consumers.status``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add subcommands; each sets ``handler=`` to a function of the parsed args."""
