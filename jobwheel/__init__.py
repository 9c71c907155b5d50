"""jobwheel's shared kernel: settings, errors, clock, logging and the CLI entry point."""

__version__ = "0.1.0"
