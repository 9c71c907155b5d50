"""Subcommands of the ``jobwheel`` CLI that belong to ``consumers`` (workers and status)."""

from __future__ import annotations

import argparse

from jobwheel.consumers.status import cli as status_cli
from jobwheel.consumers.worker import cli as worker_cli


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    worker_cli.register(sub)
    status_cli.register(sub)
