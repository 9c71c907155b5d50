"""What ``make setup`` prints while it fetches the broker jars: Maven writes bare colour codes
(``ESC[0m``) even under ``-B -q``, which a newcomer saw as escape garbage in the terminal and
in CI logs; no option of Maven's turns them off, so the Makefile strips them.

Runs the Makefile's own fetch rule in a scratch copy (the repository's ``deploy/lib`` is left
alone), with Maven's local repository as it is: offline once the jars were fetched once.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import scaled

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mvn") is None, reason="needs Maven (make setup installs it)")
def test_fetching_the_broker_jars_prints_no_escape_codes_and_keeps_maven_s_exit(
    tmp_path: Path,
) -> None:
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "deploy" / "pom.xml", tmp_path / "deploy" / "pom.xml")
    # The fetch rule's order-only prerequisites, as a set-up checkout has them.
    for name in ("pyproject.toml", "setup.py", "schemas/_flat.c", "schemas/_murmur2.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    (tmp_path / ".venv").mkdir()
    for stamp in (".installed", ".jdk"):
        (tmp_path / ".venv" / stamp).touch()

    def fetch() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["make", "-C", str(tmp_path), "deploy/lib/.fetched"],
            capture_output=True,
            timeout=scaled(300),
            check=False,
        )

    done = fetch()
    assert done.returncode == 0, done.stdout + done.stderr
    jars = list((tmp_path / "deploy" / "lib").glob("kafka*.jar"))
    assert jars, done.stdout  # it did fetch: the output below is that of a real fetch
    assert b"\x1b" not in done.stdout + done.stderr, done.stdout + done.stderr

    # A broken pom: Maven's errors still show, and make fails with it (the pipe kept its exit).
    (tmp_path / "deploy" / "pom.xml").write_text("<project>")
    (tmp_path / "deploy" / "lib" / ".fetched").unlink()
    broken = fetch()
    assert broken.returncode != 0
    assert b"[ERROR]" in broken.stdout + broken.stderr
