"""The executor's quick check of keyword arguments must agree with ``Signature.bind``."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from jobwheel.consumers.worker.executor import _Signature


def f_plain(a: Any, b: Any = 1) -> None: ...
def f_kwonly(*, a: Any, b: Any = 2) -> None: ...
def f_varkw(a: Any = 0, **rest: Any) -> None: ...
def f_varargs(*args: Any, c: Any) -> None: ...
def f_posonly(a: Any, /, b: Any = 1, **rest: Any) -> None: ...
def f_none() -> None: ...


FUNCTIONS = [f_plain, f_kwonly, f_varkw, f_varargs, f_posonly, f_none]


@given(
    fn=st.sampled_from(FUNCTIONS),
    names=st.sets(st.sampled_from(["a", "b", "c", "rest", "args", "x"]), max_size=4),
)
def test_quick_yes_only_when_bind_agrees(fn: Any, names: set[str]) -> None:
    kwargs = dict.fromkeys(names, 0)
    signature = inspect.signature(fn)
    try:
        signature.bind(**kwargs)
        binds = True
    except TypeError:
        binds = False
    quick = _Signature(signature).accepts_keywords(kwargs)
    assert not quick or binds  # a quick yes is always right; a no defers to bind()
    if fn is not f_posonly:
        assert quick == binds  # and without positional-only parameters it decides alone
