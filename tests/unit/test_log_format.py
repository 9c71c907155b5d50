"""Which log format a process writes: JOBWHEEL_LOG_FORMAT when set, else text at a terminal and
JSON anywhere else (jobwheel.logs.choose_format, the one place it is chosen). A worker started
by hand at a terminal printed JSON lines meant for machines; the stack's services each chose
for themselves (a pipe: JSON) whatever the stack was told."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwheel import logs
from tests.support import jobwheel_argv, scaled, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A real pseudo-terminal: (the side a process writes to, the side that reads it)."""
    reader, writer = os.openpty()
    yield writer, reader
    os.close(reader)
    os.close(writer)


def test_unset_means_text_at_a_terminal_and_json_elsewhere(
    terminal: tuple[int, int], tmp_path: Path
) -> None:
    with open(terminal[0], "w", closefd=False) as tty:
        assert logs.choose_format(None, tty) == "text"
        assert logs.choose_format("json", tty) == "json"  # the setting wins
    with open(tmp_path / "file.log", "w") as file:
        assert logs.choose_format(None, file) == "json"
        assert logs.choose_format("text", file) == "text"


def _drain(fd: int, into: list[bytes]) -> None:
    """Read the terminal until its last writer is gone (EIO), so a child never blocks on a
    full terminal buffer."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        into.append(chunk)


@pytest.mark.parametrize(("setting", "json_lines"), [(None, False), ("json", True)])
def test_a_worker_at_a_terminal_writes_text_unless_told_json(
    tmp_path: Path, setting: str | None, json_lines: bool
) -> None:
    """A real `jobwheel worker` whose stderr is a terminal (it stops at its --tasks import,
    before a broker would be reached)."""
    writer, reader = os.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env.update(PYTHONPATH=str(REPO), JOBWHEEL_DATA_DIR=str(tmp_path))
    if setting is not None:
        env["JOBWHEEL_LOG_FORMAT"] = setting
    chunks: list[bytes] = []
    drain = threading.Thread(target=_drain, args=(reader, chunks), daemon=True)
    drain.start()
    try:
        proc = subprocess.run(
            jobwheel_argv(["jobwheel", "worker", "--tasks", "no_such_module"]),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=writer,
            timeout=scaled(60),
        )
        # Read what it said while the terminal is still open: once its last writer closes,
        # Linux may drop what the reader has not taken yet (a loaded full run lost it all).
        wait_until(
            lambda: b"no_such_module" in b"".join(chunks),
            10,
            0.05,
            f"the worker never named the module: {b''.join(chunks)!r}",
        )
    finally:
        os.close(writer)  # the child is gone: the reader now sees the end
    drain.join(scaled(10))
    os.close(reader)
    said = b"".join(chunks).decode().replace("\r\n", "\n")
    assert proc.returncode == 1, said
    (last,) = [line for line in said.splitlines() if "no_such_module" in line]
    assert last.startswith("{") is json_lines, said
    if not json_lines:
        assert last.startswith("jobwheel worker: --tasks: cannot import module"), said


def test_the_stack_gives_its_services_its_own_choice(tmp_path: Path) -> None:
    """Every service's log file is in the format the stack chose: its stderr is the stack's
    pipe, where each would choose JSON while the stack at a terminal shows text."""
    from jobwheel.deploy.stack import Stack
    from jobwheel.settings import Settings

    stack = Stack(Settings(data_dir=tmp_path))  # type: ignore[call-arg]
    try:
        for fmt in ("text", "json"):
            logs.configure("INFO", fmt)
            for service in stack.services:
                assert stack.child_env(service)["JOBWHEEL_LOG_FORMAT"] == fmt, service.name
    finally:
        logs.configure("INFO", None)


def test_a_log_file_in_the_other_format_is_set_aside_not_appended_to(tmp_path: Path) -> None:
    """`make run` (text) after a `jobwheel up` whose services wrote JSON appended text lines
    to JSON lines in one file."""
    from jobwheel.deploy.stack import set_aside_other_format

    log = tmp_path / "worker.log"
    json_line = '{"ts": 1.0, "level": "info", "logger": "w", "msg": "worker started"}\n'
    text_line = "info  w: worker started pid=1\n"
    log.write_text(text_line + "a line of framework output\n")
    assert set_aside_other_format(log, "text") is None and log.exists()  # the same format
    assert set_aside_other_format(tmp_path / "none.log", "text") is None  # no file yet

    log.write_text(json_line + "Traceback (most recent call last):\n")
    assert set_aside_other_format(log, "text") == tmp_path / "worker.log.json"
    assert not log.exists()
    assert (tmp_path / "worker.log.json").read_text() == json_line + (
        "Traceback (most recent call last):\n"
    )
    log.write_text(json_line)  # again: joins the JSON kept before
    assert set_aside_other_format(log, "text") == tmp_path / "worker.log.json"
    assert (tmp_path / "worker.log.json").read_text().count(json_line) == 2
    log.write_text(text_line)
    assert set_aside_other_format(log, "json") == tmp_path / "worker.log.text"


def test_http_clients_say_only_their_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    """The Schema Registry client (httpx) logs every request at INFO: a scheduler encoding
    through a registry printed one line per record."""
    import logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO", "json")
        logging.getLogger("jobwheel.test").info("ours")
        logging.getLogger("httpx").info("HTTP Request: POST http://registry/subjects 200 OK")
        logging.getLogger("httpx").warning("registry slow")
        err = capsys.readouterr().err
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        logging.getLogger("httpx").setLevel(logging.NOTSET)
    assert '"msg": "ours"' in err  # the reader sees INFO lines of its own
    assert "HTTP Request" not in err
    assert "registry slow" in err


def test_a_sampled_line_is_due_once_per_interval_and_counts_what_it_stands_for(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    lines = logs.Sampled(interval_s=30.0)
    assert lines.due() == 1  # the first is written at once
    assert [lines.due() for _ in range(4)] == [0, 0, 0, 0]
    now[0] += 29.9
    assert lines.due() == 0
    now[0] += 0.1
    assert lines.due() == 6  # this one and the five suppressed
    assert lines.due() == 0
