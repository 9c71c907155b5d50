"""The task registry: names are the only way from a message to code."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobwheel.consumers.worker.backoff import Backoff
from jobwheel.consumers.worker.registry import TaskRegistry, default_registry, task
from jobwheel.errors import TaskError


def test_decorator_registers_by_name_and_returns_the_function_unchanged() -> None:
    reg = TaskRegistry()

    @reg.task("send_email", timeout=timedelta(seconds=30), max_attempts=5)
    def send_email(to: str) -> str:
        return to

    assert send_email("a@b") == "a@b"
    spec = reg.get("send_email")
    assert spec.fn is send_email
    assert spec.timeout_ms == 30_000
    assert spec.max_attempts == 5
    assert not spec.is_async
    assert "send_email" in reg and reg.names() == ["send_email"]


def test_async_functions_are_recognised_and_seconds_are_accepted_as_timeout() -> None:
    reg = TaskRegistry()

    @task("a.b:c-d_1", timeout=1.5, registry=reg, backoff=Backoff(base_ms=10, max_ms=20))
    async def fn() -> None:
        return None

    spec = reg.get("a.b:c-d_1")
    assert spec.is_async
    assert spec.timeout_ms == 1_500
    assert spec.backoff.base_ms == 10


def test_global_decorator_uses_the_default_registry() -> None:
    @task("test_worker_registry.global")
    def fn() -> None:
        return None

    assert default_registry.get("test_worker_registry.global").fn is fn


def test_unknown_task_error_names_the_task_and_the_fix() -> None:
    reg = TaskRegistry()
    reg.register("known", lambda: None)
    with pytest.raises(TaskError) as info:
        reg.get("os.system")
    message = str(info.value)
    assert "'os.system'" in message
    assert "--tasks" in message
    assert "known" in message


def test_a_name_taken_by_another_function_is_refused() -> None:
    reg = TaskRegistry()

    def one() -> None: ...

    def two() -> None: ...

    reg.register("dup", one)
    reg.register("dup", one)  # the same definition again (module imported twice) is fine
    with pytest.raises(TaskError, match="already registered"):
        reg.register("dup", two)


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "x" * 201, "path/like"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(TaskError, match="invalid"):
        TaskRegistry().register(name, lambda: None)


def test_bad_declarations_are_refused() -> None:
    reg = TaskRegistry()
    with pytest.raises(TaskError, match="max_attempts"):
        reg.register("a", lambda: None, max_attempts=0)
    with pytest.raises(TaskError, match="timeout"):
        reg.register("b", lambda: None, timeout=0)
    with pytest.raises(TaskError, match="not callable"):
        reg.register("c", 42)  # type: ignore[arg-type]

    def gen():
        yield 1

    with pytest.raises(TaskError, match="generator"):
        reg.register("d", gen)
