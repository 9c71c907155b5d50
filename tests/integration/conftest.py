"""Fixtures of the integration tests beside those of ``tests/conftest.py``.

``tail``: the test's :class:`~tests.integration.scheduler_support.TopicTail` on its
``settings`` (every runs topic, status, acks and dead letters), closed with the test. A module
whose tests run on other settings defines its own ``tail`` on them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobwheel.settings import Settings
from tests.integration.scheduler_support import TopicTail


@pytest.fixture
def tail(settings: Settings) -> Iterator[TopicTail]:
    reader = TopicTail(settings)
    yield reader
    reader.close()
