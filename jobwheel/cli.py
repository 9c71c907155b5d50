"""The ``jobwheel`` command. Each package registers its own subcommands (``<pkg>/cli.py``).

Subcommand modules keep heavy imports (faust, confluent-kafka, chdb) inside the handlers so
``jobwheel --help`` and quick commands start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jobwheel import logs
from jobwheel.errors import JobwheelError, ValidationError
from jobwheel.settings import get_settings


def build_parser() -> argparse.ArgumentParser:
    from consumers import cli as consumers_cli
    from deploy import cli as deploy_cli
    from producers import cli as producers_cli
    from streams import cli as streams_cli

    parser = argparse.ArgumentParser(
        prog="jobwheel", description="A distributed job scheduler on Apache Kafka."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (deploy_cli, producers_cli, streams_cli, consumers_cli):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = get_settings()
    logs.configure(settings.log_level, settings.log_format)
    try:
        return int(args.handler(args) or 0)
    except ValidationError as exc:
        print(f"jobwheel {args.command}: invalid {exc}", file=sys.stderr)
        return 2
    except JobwheelError as exc:
        print(f"jobwheel {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
