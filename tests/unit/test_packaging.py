"""The packaging rules that pyproject.toml states and the code relies on: one import root mapped
onto the repository's folders, every package folder installed, the extras by role in step with
:mod:`jobwheel.extras`, and a server command without its extra answering in one line.

The built wheel in fresh environments is tests/integration/test_wheel.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from jobwheel import extras

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """The repository folder of an installed package name, by the package-dir mapping."""
    mapping = SETUPTOOLS["package-dir"]
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        root = ".".join(parts[:cut])
        if root in mapping:
            return REPO / mapping[root] / Path(*parts[cut:])
    raise AssertionError(f"{package} is outside the package-dir mapping")


def test_every_package_folder_is_installed_under_jobwheel() -> None:
    """Every folder of code is listed. The other names listed are folders of data files
    (listed, or setuptools warns about each on every install): each has its files in
    package-data and no Python in it."""
    listed = set(SETUPTOOLS["packages"])
    assert all(name == "jobwheel" or name.startswith("jobwheel.") for name in listed)
    on_disk = set()
    for root, folder in SETUPTOOLS["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            on_disk.add(".".join([root, *rel.parts]))
    assert on_disk <= listed, on_disk - listed
    for name in listed - on_disk:
        folder = _folder(name)
        assert folder.is_dir() and not list(folder.rglob("*.py")), name
        assert name in SETUPTOOLS["package-data"], name


def test_benchmarks_and_tests_are_not_installed() -> None:
    folders = set(SETUPTOOLS["package-dir"].values())
    assert not folders & {"load", "tests", "."}


def test_package_data_names_files_that_exist() -> None:
    for package, patterns in SETUPTOOLS["package-data"].items():
        for pattern in patterns:
            assert list(_folder(package).glob(pattern)), (package, pattern)


def test_the_extras_of_the_cli_are_the_extras_of_the_distribution() -> None:
    declared = set(PROJECT["project"]["optional-dependencies"])
    assert set(extras.MODULES) <= declared
    assert set(extras.COMMANDS.values()) <= declared
    base = " ".join(PROJECT["project"]["dependencies"])
    for server in ("rocksdict", "chdb", "fastapi", "uvicorn", "prometheus", "orjson"):
        assert server not in base


@pytest.mark.parametrize(
    ("command", "missing", "extra"),
    [
        ("scheduler", "rocksdict", "scheduler"),
        ("scheduler", "prometheus_client", "scheduler"),
        ("worker", "prometheus_client", "worker"),
        ("serve", "fastapi", "status"),
        ("serve", "prometheus_client", "status"),
        ("status", "clickhouse_connect", "status"),
        ("submit", "authlib", "registry"),
    ],
)
def test_a_missing_optional_dependency_names_its_extra(
    command: str, missing: str, extra: str
) -> None:
    message = extras.missing_message(command, ModuleNotFoundError(name=missing))
    assert message is not None
    assert message.endswith(f"pip install 'jobwheel[{extra}]'")


def test_a_missing_module_that_is_not_a_dependency_is_not_blamed_on_an_extra() -> None:
    assert extras.missing_message("worker", ModuleNotFoundError(name="my_tasks")) is None


def test_a_service_without_its_extra_says_so_in_one_line(tmp_path: Path) -> None:
    # As on an install without the worker extra: the metrics library cannot be imported.
    script = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "from jobwheel.cli import main\n"
        "sys.exit(main(['worker', '--tasks', 'jobwheel.consumers.demo']))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "JOBWHEEL_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    env["JOBWHEEL_BOOTSTRAP_SERVERS"] = "127.0.0.1:9"
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "prometheus_client is not installed" in lines[0]
    assert "pip install 'jobwheel[worker]'" in lines[0]


def test_the_editable_install_maps_the_folders_from_anywhere(tmp_path: Path) -> None:
    """From the repository root (where ``./jobwheel/`` is a plain package on sys.path, as under
    pytest) and from any other folder (a ``python -m jobwheel.cli`` subprocess), each part
    imports from its own folder of this checkout, once, under its ``jobwheel.*`` name only."""
    import jobwheel.consumers.worker
    import jobwheel.schemas

    assert Path(jobwheel.schemas.__file__).parent == REPO / "schemas"
    assert Path(jobwheel.consumers.worker.__file__).parent == REPO / "consumers" / "worker"
    script = (
        "import importlib.util, json, jobwheel.cli, jobwheel.schemas.codec, jobwheel.streams\n"
        "print(json.dumps([jobwheel.schemas.codec.__file__, jobwheel.streams.__file__,\n"
        "    importlib.util.find_spec('schemas') is None]))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    codec, streams, no_old_name = json.loads(result.stdout)
    assert Path(codec) == REPO / "schemas" / "codec.py"
    assert Path(streams) == REPO / "streams" / "__init__.py"
    assert no_old_name
    help_ = subprocess.run(
        [sys.executable, "-m", "jobwheel.cli", "--help"], capture_output=True, text=True,
        timeout=60, check=False, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert help_.returncode == 0 and help_.stdout.startswith("usage: jobwheel"), help_.stderr
