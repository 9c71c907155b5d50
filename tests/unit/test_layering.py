"""The layering of ARCHITECTURE.md, checked on the imports of every installed module (read with
``ast``: top-level, inside functions and under ``TYPE_CHECKING`` alike).

- the wire contract (``jobwheel.schemas``) imports only ``jobwheel.errors`` of the rest;
- the kernel (``jobwheel``'s own modules, ``jobwheel.kafka`` included) imports the contract and
  itself, except the CLI entry point (each part's ``cli``) and the package's lazy
  ``JobClient`` re-export;
- producers, the scheduler, the worker and deploy import the contract and the kernel; the
  status service may also use the client SDK (it accepts commands through it) and
  ``jobwheel health`` reads ``jobwheel up``'s stack file;
- nothing imports the old top-level names (``schemas``, ``producers``, ...), ``load`` or
  ``tests``;
- ``confluent_kafka`` is imported only by the Kafka home (``jobwheel.kafka``) and the
  scheduler's transactional clients built on it (``jobwheel.streams.kafka``); the codec's
  Schema Registry adapter imports the registry client only.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = _SETUPTOOLS["package-dir"]
OLD_ROOTS = {"schemas", "producers", "streams", "consumers", "deploy", "load", "tests"}

#: Which parts each part may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),  # plus jobwheel.errors, below
    "kernel": {"schemas"},
    "producers": {"schemas", "kernel"},
    "streams": {"schemas", "kernel"},
    "worker": {"schemas", "kernel"},
    "status": {"schemas", "kernel", "producers"},
    "consumers": {"schemas", "kernel", "worker", "status"},
    "deploy": {"schemas", "kernel"},
}
#: Single edges outside the table above, each for a stated reason.
EXCEPTIONS: dict[str, set[str]] = {
    # the entry point: each part registers its own subcommands
    "jobwheel.cli": {
        "jobwheel.consumers.cli",
        "jobwheel.deploy.cli",
        "jobwheel.producers.cli",
        "jobwheel.streams.cli",
    },
    # `from jobwheel import JobClient`, imported on first use
    "jobwheel": {"jobwheel.producers.client"},
    # `jobwheel health` asks the services of the `jobwheel up` on this data dir
    "jobwheel.consumers.status.cli": {"jobwheel.deploy.stack"},
}
#: Besides the Kafka home, the modules that may import confluent_kafka: the scheduler's
#: transactional clients (exactly-once needs the client's transactional API itself).
KAFKA_CLIENTS = {"jobwheel.streams.kafka"}


def _modules() -> dict[str, Path]:
    out = {}
    for root, folder in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if root == "jobwheel" and rel.parts[0] in {"schemas"}:  # never: folders are separate
                continue
            out[".".join([root, *parts])] = path
    return out


MODULES = _modules()


def part(module: str) -> str:
    names = module.split(".")
    if names[0] != "jobwheel":
        raise ValueError(module)
    second = names[1] if len(names) > 1 else ""
    if second == "consumers":
        third = names[2] if len(names) > 2 else ""
        return {"worker": "worker", "status": "status"}.get(third, "consumers")
    if second in {"schemas", "producers", "streams", "deploy"}:
        return second
    return "kernel"


def imports(module: str, path: Path) -> set[str]:
    """Every module name ``module`` imports (``from a import b``: ``a.b`` if that is a module of
    jobwheel, else ``a``; for other libraries ``a.b``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            for alias in node.names:  # a submodule, or a name of the module ``name``
                full = f"{name}.{alias.name}"
                out.add(full if full in MODULES or not name.startswith("jobwheel") else name)
    return out


def _internal(name: str) -> str | None:
    """The jobwheel module ``name`` refers to (a module, or the package of an imported name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_installed_module_is_checked() -> None:
    assert "jobwheel.streams.engine" in MODULES
    assert "jobwheel.kafka.admin" in MODULES
    assert "jobwheel.schemas.codec" in MODULES
    assert all(part(m) for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layering(module: str) -> None:
    mine = part(module)
    bad = []
    for name in sorted(imports(module, MODULES[module])):
        root = name.partition(".")[0]
        if root in OLD_ROOTS:
            bad.append(f"{name} (import it as jobwheel.{name}; load and tests are not installed)")
            continue
        if root != "jobwheel":
            continue
        target = _internal(name)
        if target is None or target == "jobwheel" and name != "jobwheel":
            continue
        theirs = part(target)
        if theirs == mine or theirs in ALLOWED[mine]:
            continue
        if mine == "schemas" and target == "jobwheel.errors":
            continue
        if target in EXCEPTIONS.get(module, set()):
            continue
        bad.append(f"{name} ({mine} may not import {theirs})")
    assert not bad, f"{module} imports: " + "; ".join(bad)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_kafka_home_imports_the_kafka_client(module: str) -> None:
    found = {
        n for n in imports(module, MODULES[module]) if n.partition(".")[0] == "confluent_kafka"
    }
    if module.startswith("jobwheel.kafka") or module in KAFKA_CLIENTS:
        return
    if module == "jobwheel.schemas.registry":  # the Schema Registry adapter, nothing of Kafka
        found = {n for n in found if not n.startswith("confluent_kafka.schema_registry")}
    assert not found, f"{module} imports {sorted(found)}: use jobwheel.kafka instead"


def test_the_scheduler_depends_on_no_other_part() -> None:
    """The scheduler's own rule, stated on its own: it is deployed and scaled alone."""
    for module, path in MODULES.items():
        if part(module) != "streams":
            continue
        for name in imports(module, path):
            target = _internal(name) if name.startswith("jobwheel") else None
            if target is not None:
                assert part(target) in {"streams", "schemas", "kernel"}, (module, name)
