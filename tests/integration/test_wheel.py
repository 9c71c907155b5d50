"""The distribution as a user gets it: the wheel built from this tree, installed into fresh
virtual environments, never the editable install of the repository.

- ``pip install jobwheel`` (no extras) is the client SDK: one top-level package, ``jobwheel``;
  none of the server side (RocksDB, the embedded ClickHouse, FastAPI, uvicorn, Prometheus, the
  Schema Registry client); ``JobClient`` imports and the Avro contract loads from the package
  data; a server command names the extra to install in one line.
- ``pip install 'jobwheel[all]'``: every module imports, every subcommand answers ``--help``,
  and the package data the servers read (migrations, console files, the broker's pom) is there.

The wheel carries the flat codec's and the partitioner's C modules (``schemas/_flat.c``,
``schemas/_murmur2.c``), compiled by the build, so it is one platform's wheel; the client
install checks that the codec runs on it.

The dependencies come from a wheelhouse kept between runs (``JOBWHEEL_TEST_WHEELHOUSE``, by
default ``~/.cache/jobwheel/test-wheelhouse``), filled from the configured package index the
first time, so later runs install without the index. The wheel is built without build
isolation from a copy of the sources (the dev extra carries setuptools), so no stale ``build/``
folder of the repository can leak into it and no index is needed for the build either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The folders the wheel is built from (pyproject.toml's package-dir); load/ and tests/ are not.
SOURCES = ("jobwheel", "schemas", "producers", "streams", "consumers", "deploy")
#: Distributions only a server role may pull in.
SERVER_ONLY = {
    "rocksdict",
    "orjson",
    "chdb",
    "chdb-core",
    "clickhouse-connect",
    "fastapi",
    "fastapi-offline",
    "starlette",
    "uvicorn",
    "prometheus-client",
    "authlib",
    "httpx2",
}
WHEELHOUSE = Path(
    os.environ.get("JOBWHEEL_TEST_WHEELHOUSE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "jobwheel"
    / "test-wheelhouse"
)

# The first run downloads ~300 MB of wheels from the package index (skipped, saying so, when
# the wheelhouse lacks them and the index is unreachable); later runs need no network.
pytestmark = pytest.mark.timeout(900)


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    return result  # type: ignore[no-any-return]


def _pip(*args: str | Path, python: Path | None = None) -> subprocess.CompletedProcess[str]:
    target = ["--python", str(python)] if python else []
    return _run([sys.executable, "-m", "pip", *target, *map(str, args)])


def _checked(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def wheel(work: Path) -> Path:
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    # *.so: the editable install's build of the C module; the wheel's must come from the build.
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "lib", "compose", "*.egg-info", "*.so")
    for folder in SOURCES:
        shutil.copytree(REPO / folder, src / folder, ignore=skip)
    dist = work / "dist"
    _checked(
        _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist, src)
    )
    (built,) = dist.glob("jobwheel-*.whl")
    return built


def _venv(work: Path, wheel: Path, name: str, extra: str = "") -> Path:
    """A fresh virtual environment with the wheel (and ``extra``) installed; its python."""
    home = work / name
    _checked(_run([sys.executable, "-m", "venv", "--without-pip", str(home)]))
    python = home / "bin" / "python"
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    offline = ("install", "-q", "--no-index", "--find-links", WHEELHOUSE, target)
    if _pip(*offline, python=python).returncode != 0:
        # Not all in the wheelhouse yet: fetch what is missing from the index, once.
        unreachable = _index_unreachable()
        if unreachable:
            pytest.skip(
                f"the wheelhouse {WHEELHOUSE} lacks dependencies of jobwheel[{extra}] and the "
                f"package index is unreachable ({unreachable}): this test downloads ~300 MB "
                "of wheels once, then runs offline. Run it once with the index reachable, or "
                "fill the wheelhouse: pip download -d <wheelhouse> '<the built wheel>[all]' "
                "(JOBWHEEL_TEST_WHEELHOUSE names it)"
            )
        _checked(_pip("download", "-q", "-d", WHEELHOUSE, "--find-links", WHEELHOUSE, target))
        for copy in WHEELHOUSE.glob("jobwheel-*.whl"):  # the wheel under test is not cached
            copy.unlink()
        _checked(_pip(*offline, python=python))
    return python


def _index_unreachable() -> str | None:
    """Why pip's package index cannot be reached now (None: it answers). The URL is pip's own
    (``pip config``/PIP_INDEX_URL, else PyPI); any HTTP answer counts as reachable."""
    import urllib.error
    import urllib.request

    configured = _pip("config", "get", "global.index-url").stdout.strip()
    url = os.environ.get("PIP_INDEX_URL") or configured or "https://pypi.org/simple/"
    try:
        with urllib.request.urlopen(url, timeout=10):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"


def _env(work: Path) -> dict[str, str]:
    """A user's environment: no JOBWHEEL_* of the test session, a broker nobody listens on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBWHEEL_", "PYTHON"))}
    env["JOBWHEEL_DATA_DIR"] = str(work / "data")
    env["JOBWHEEL_BOOTSTRAP_SERVERS"] = "127.0.0.1:9"
    return env


@pytest.fixture(scope="module")
def client_python(work: Path, wheel: Path) -> Iterator[Path]:
    yield _venv(work, wheel, "client")


@pytest.fixture(scope="module")
def all_python(work: Path, wheel: Path) -> Iterator[Path]:
    yield _venv(work, wheel, "all", extra="all")


def test_the_wheel_holds_one_top_level_package_and_no_benchmarks_or_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    name, version = wheel.name.split("-")[:2]
    assert {n.split("/")[0] for n in names} == {"jobwheel", f"{name}-{version}.dist-info"}
    assert not [n for n in names if n.startswith(("jobwheel/load/", "jobwheel/tests/"))]


@pytest.mark.parametrize("module", ["_flat", "_murmur2"])
def test_the_wheel_carries_the_compiled_c_modules(wheel: Path, module: str) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert f"jobwheel/schemas/{module}{suffix}" in names, sorted(n for n in names if module in n)
    assert f"jobwheel/schemas/{module}.c" not in names  # the source stays in the sdist


def test_the_client_install_is_the_sdk_without_the_server_side(
    client_python: Path, work: Path
) -> None:
    listed = _checked(_pip("list", "--format", "json", python=client_python)).stdout
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "jobwheel" in installed
    assert not installed & SERVER_ONLY, sorted(installed & SERVER_ONLY)

    script = (
        "import importlib.metadata as m, json\n"
        "from jobwheel import JobClient\n"
        "from jobwheel.producers import AsyncJobClient, JobSpec\n"
        "from jobwheel.schemas.codec import default_codec\n"
        "from jobwheel.schemas.flat import FlatRecord\n"
        "versions = [v.label() for v in default_codec().catalogue.versions]\n"
        "tops = sorted({f.parts[0] for f in m.files('jobwheel') if f.parts[0] != '..'})\n"
        "run = default_codec().catalogue.current('io.jobwheel.Run').parsed\n"
        "native = FlatRecord.compile(run).native\n"
        "print(json.dumps({'client': JobClient.__module__, 'versions': versions, 'tops': tops,\n"
        "    'native': native}))\n"
    )
    out = _checked(_run([str(client_python), "-c", script], cwd=work, env=_env(work))).stdout
    found = json.loads(out)
    assert found["client"] == "jobwheel.producers.client"
    assert found["native"]  # the flat codec runs on the C module the wheel carries
    assert len(found["versions"]) == len(list((REPO / "schemas" / "avro").glob("*.avsc")))
    assert [t for t in found["tops"] if not t.endswith(".dist-info")] == ["jobwheel"]


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["scheduler"], "scheduler"),
        (["worker", "--tasks", "jobwheel.consumers.demo"], "worker"),
        (["serve"], "status"),
        (["sink"], "status"),
        (["up"], "all"),
    ],
)
def test_a_server_command_without_its_extra_names_the_extra_in_one_line(
    client_python: Path, work: Path, argv: list[str], extra: str
) -> None:
    jobwheel = client_python.with_name("jobwheel")
    result = _run([str(jobwheel), *argv], cwd=work, env=_env(work), timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pip install 'jobwheel[{extra}]'" in lines[0]
    assert "Traceback" not in result.stderr


def _subcommands(python: Path, work: Path) -> list[list[str]]:
    script = (
        "import argparse, json\n"
        "from jobwheel.cli import build_parser\n"
        "def walk(parser, path):\n"
        "    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]\n"
        "    if path:\n"
        "        yield path\n"
        "    for action in subs:\n"
        "        for name, child in action.choices.items():\n"
        "            yield from walk(child, [*path, name])\n"
        "print(json.dumps(list(walk(build_parser(), []))))\n"
    )
    return json.loads(_checked(_run([str(python), "-c", script], cwd=work, env=_env(work))).stdout)


def test_with_all_extras_every_subcommand_answers_help(all_python: Path, work: Path) -> None:
    # The installed console script itself, at the top and for one server command ...
    jobwheel = all_python.with_name("jobwheel")
    for argv in [[], ["scheduler"]]:
        result = _run([str(jobwheel), *argv, "--help"], cwd=work, env=_env(work), timeout=60)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stdout.startswith(f"usage: jobwheel {' '.join(argv)}".rstrip()), argv
    # ... and every subcommand through the script's entry point in one interpreter (a process
    # per subcommand cost 10 s of CPU, 31 interpreters starting for the same parser).
    commands = _subcommands(all_python, work)
    assert ["scheduler"] in commands and ["broker", "start"] in commands
    script = (
        "import contextlib, io, json, sys\n"
        "from importlib.metadata import entry_points\n"
        "main = entry_points(group='console_scripts')['jobwheel'].load()\n"
        "answers = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            code = main([*argv, '--help'])\n"
        "        except SystemExit as exit:\n"
        "            code = exit.code\n"
        "    answers.append([argv, code, out.getvalue(), err.getvalue()])\n"
        "print(json.dumps(answers))\n"
    )
    answers = json.loads(
        _checked(
            _run([str(all_python), "-c", script, json.dumps(commands)], cwd=work, env=_env(work))
        ).stdout
    )
    assert [argv for argv, *_ in answers] == commands
    for argv, code, out, err in answers:
        assert code == 0, (argv, err)
        assert out.startswith(f"usage: jobwheel {' '.join(argv)}"), argv


def test_with_all_extras_every_module_imports_and_the_data_files_are_there(
    all_python: Path, work: Path
) -> None:
    script = (
        "import importlib, json, pkgutil\n"
        "import jobwheel\n"
        "names = [m.name for m in pkgutil.walk_packages(jobwheel.__path__, 'jobwheel.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "from jobwheel.consumers.status.console import STATIC\n"
        "from jobwheel.consumers.status.store import MIGRATIONS_DIR\n"
        "from jobwheel.deploy.broker import LOG4J2_CONFIG, POM\n"
        "print(json.dumps({'modules': names,\n"
        "    'migrations': sorted(p.name for p in MIGRATIONS_DIR.glob('*.sql')),\n"
        "    'static': sorted(p.name for p in STATIC.iterdir()),\n"
        "    'deploy': [POM.is_file(), LOG4J2_CONFIG.is_file()]}))\n"
    )
    found = json.loads(
        _checked(_run([str(all_python), "-c", script], cwd=work, env=_env(work))).stdout
    )
    assert "jobwheel.streams.engine" in found["modules"]
    assert "jobwheel.consumers.status.api" in found["modules"]
    shipped = sorted(p.name for p in (REPO / "consumers/status/migrations").glob("*.sql"))
    assert found["migrations"] == shipped
    assert found["static"] == sorted(
        p.name for p in (REPO / "consumers/status/console/static").iterdir()
    )
    assert found["deploy"] == [True, True]
