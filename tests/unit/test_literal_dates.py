"""No test may depend on the calendar: a literal date that a TTL or the "more than an hour in
the past" rule can reach turns into a failure on some future day.

The status store drops rows older than its TTL (30 days) at insert, and a job's ``at`` more
than an hour before the wall clock is refused. A test that writes a fixed 2027 instant into a
store passes until early 2027 and then fails for good (it happened: ``test_job_spec.py``). So
in a test module that can reach either rule (it opens the status store, drives a jobwheel
process or the API, or lives in ``tests/integration``), every instant must come from "now".

Only dates before :data:`SAFE_BEFORE` are allowed there: they are already far beyond every such
rule, so their outcome can no longer change with the calendar (``"2001-01-01T10:00:00Z"`` is
refused today and on every later day). A line whose literal date never meets the wall clock (an
injected clock, a value only parsed, refused for its form) says so with ``# fixed date: <why>``;
a module where that holds for every date says it once, ``# fixed dates: <why>``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: Older than every TTL and past rule by years: such a date's outcome is fixed.
SAFE_BEFORE = datetime(2021, 1, 1, tzinfo=UTC)
#: Epoch milliseconds between 2000 and 2100: an instant written as a number.
EPOCH_MS = range(946_684_800_000, 4_102_444_800_000)
ISO_DATE = re.compile(r"(?<!\d)((?:19|20|21)\d\d)-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?!\d)")
EXEMPT = "# fixed date:"
EXEMPT_MODULE = "# fixed dates:"

#: Modules whose import means the test reaches a TTL or the wall-clock past rule: the status
#: store and its sink, the API and console in front of it, the CLI and anything that spawns a
#: jobwheel process (the past rule runs against the real clock there).
REACHES = (
    "jobwheel.consumers.status",
    "jobwheel.cli",
    "tests.status_support",
    "tests.stack_support",
    "tests.integration",
    "subprocess",
)


@dataclass(frozen=True)
class LiteralDate:
    path: Path
    line: int
    text: str
    when: datetime

    def __str__(self) -> str:
        return f"{self.path.relative_to(TESTS.parent)}:{self.line}: {self.text}"


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reaches_a_rule(path: Path, tree: ast.AST) -> bool:
    if (TESTS / "integration") in path.parents:
        return True
    return any(name == r or name.startswith(r + ".") for name in _imports(tree) for r in REACHES)


def literal_dates(path: Path, source: str, tree: ast.AST) -> list[LiteralDate]:
    """Every date written into the module: ``datetime(2027, ...)``/``date(...)`` with a
    literal year, an ISO date inside a string, an epoch-milliseconds integer."""
    lines = source.splitlines()
    found: list[LiteralDate] = []

    def add(node: ast.AST, when: datetime) -> None:
        line = getattr(node, "lineno", 0)
        found.append(LiteralDate(path, line, lines[line - 1].strip(), when))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            args = node.args
            if (
                name in {"datetime", "date"}
                and len(args) >= 3
                and all(isinstance(a, ast.Constant) and isinstance(a.value, int) for a in args[:3])
            ):
                year, month, day = (a.value for a in args[:3])  # type: ignore[attr-defined]
                add(node, datetime(year, month, day, tzinfo=UTC))
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                for m in ISO_DATE.finditer(node.value):
                    y, mo, d = (int(g) for g in m.groups())
                    add(node, datetime(y, mo, min(d, 28), tzinfo=UTC))
            elif isinstance(node.value, int) and not isinstance(node.value, bool):
                if node.value in EPOCH_MS:
                    add(node, datetime.fromtimestamp(node.value / 1000, UTC))
    return found


def calendar_dependent(path: Path) -> list[LiteralDate]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    if not reaches_a_rule(path, tree) or EXEMPT_MODULE in source:
        return []
    lines = source.splitlines()
    found = {
        d.line: d
        for d in literal_dates(path, source, tree)
        if d.when >= SAFE_BEFORE and EXEMPT not in lines[d.line - 1]
    }
    return [found[line] for line in sorted(found)]


def test_no_test_depends_on_the_calendar() -> None:
    bombs = [d for path in sorted(TESTS.rglob("*.py")) for d in calendar_dependent(path)]
    assert not bombs, (
        "literal dates in test modules that reach the status store's TTL or the 'more than an "
        "hour in the past' rule; derive them from now (status_support.now_ms(), "
        "datetime.now(UTC)), or, when the value never meets the wall clock, say why with "
        f"'{EXEMPT} <why>' on the line:\n" + "\n".join(map(str, bombs))
    )


def test_the_check_sees_the_dates_that_went_off(tmp_path: Path) -> None:
    """The scan itself is no assertion that cannot fail: the 2027 instant that broke
    ``test_job_spec.py``, in each spelling, is found in a module that opens the store."""
    module = tmp_path / "test_bomb.py"
    module.write_text(
        "from tests import status_support\n"
        "T0 = int(datetime(2027, 1, 15, 7, 0, tzinfo=UTC).timestamp() * 1000)\n"
        "T1 = 1_800_000_000_000\n"
        'T2 = "2027-01-15T07:00:00Z"\n'
        "T3 = datetime(2001, 1, 1)\n"
        "T4 = 1_800_000_000_000  # fixed date: only parsed, never stored\n"
        'T5 = "2020-12-31"\n',
        encoding="utf-8",
    )
    assert [d.line for d in calendar_dependent(module)] == [2, 3, 4]
    module.write_text(module.read_text() + "# fixed dates: a clock is injected everywhere\n")
    assert calendar_dependent(module) == []
    pure = tmp_path / "test_pure.py"
    pure.write_text("from jobwheel.schemas.cron import parse_cron\nT = 1_800_000_000_000\n")
    assert calendar_dependent(pure) == []
