"""Which extra of the distribution installs what (``pyproject.toml``), so that a command whose
dependencies are missing says in one line what to install instead of a traceback.

The base install is the client SDK; each server role is an extra. Keep these tables in step with
``[project.optional-dependencies]`` (tests/unit/test_packaging.py compares them).
"""

from __future__ import annotations

import importlib.util

from jobwheel.errors import ConfigError

#: The importable modules each extra adds to the base install.
MODULES: dict[str, tuple[str, ...]] = {
    "registry": ("authlib", "attrs", "cachetools", "certifi", "httpx2"),
    "scheduler": ("rocksdict", "orjson", "prometheus_client"),
    "worker": ("prometheus_client",),
    "status": (
        "clickhouse_connect",
        "chdb",
        "fastapi",
        "fastapi_offline",
        "uvicorn",
        "prometheus_client",
    ),
}

#: The extra a subcommand needs (every other subcommand runs on the base install).
COMMANDS: dict[str, str] = {
    "scheduler": "scheduler",
    "worker": "worker",
    "serve": "status",
    "sink": "status",
    "up": "all",
}


def install_hint(extra: str) -> str:
    return f"pip install 'jobwheel[{extra}]'"


def extra_for(command: str, exc: ImportError) -> str | None:
    """The extra that would have prevented ``exc``, or None when the missing module is not one
    of jobwheel's optional dependencies (then it is a real bug or the user's own import)."""
    top = (exc.name or "").partition(".")[0]
    owners = [extra for extra, modules in MODULES.items() if top in modules]
    if not owners:
        return None
    wanted = COMMANDS.get(command)
    if wanted is not None and (wanted == "all" or wanted in owners):
        return wanted
    return owners[0]


def missing_message(command: str, exc: ImportError) -> str | None:
    """One line for a missing optional dependency, or None when ``exc`` is not one."""
    extra = extra_for(command, exc)
    if extra is None:
        return None
    return f"{exc.name} is not installed; this needs the {extra} extra: {install_hint(extra)}"


def require(extra: str) -> None:
    """Fail early, in one line, when the modules of ``extra`` are not installed (``all``: every
    server role), e.g. before ``jobwheel up`` starts a broker for services that cannot run."""
    extras = [e for e in MODULES if e != "registry"] if extra == "all" else [extra]
    missing = sorted({m for e in extras for m in MODULES[e] if importlib.util.find_spec(m) is None})
    if missing:
        raise ConfigError(f"{', '.join(missing)} not installed: {install_hint(extra)}")
