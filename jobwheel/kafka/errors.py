"""confluent-kafka's errors as jobwheel's (:mod:`jobwheel.errors`), in one place: each with the
librdkafka error name as ``.code`` and a message that says what failed."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from jobwheel.errors import BrokerError, DeliveryError
from jobwheel.logs import Throttle, librdkafka_logger

log = logging.getLogger(__name__)
# Every client's error_cb logs here: while a broker is down, librdkafka reports each reconnect
# attempt (seen: 20 lines a second from one stopping worker). One line per code per 30 s.
log.addFilter(Throttle())


def kafka_error(exc: BaseException | KafkaError) -> KafkaError | None:
    """The ``KafkaError`` inside a ``KafkaException`` (or the error itself), if there is one."""
    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def broker_error(exc: BaseException | KafkaError, what: str) -> BrokerError:
    """``what: <librdkafka's text> (<code>)`` as a :class:`BrokerError`."""
    err = kafka_error(exc)
    if err is not None:
        return BrokerError(f"{what}: {err.str()} ({err.name()})", code=err.name())
    return BrokerError(f"{what}: {exc}")


def error_text(exc: BaseException) -> str:
    """One line for an error of a command that reports rather than raises (``jobwheel
    health``, the console's cluster views): librdkafka's text and code, else the exception."""
    err = kafka_error(exc)
    if err is not None:
        return f"{err.str()} ({err.name()})"
    return f"{type(exc).__name__}: {exc}"


def delivery_error(err: KafkaError, what: str = "record") -> DeliveryError:
    return DeliveryError(
        f"{what} not delivered: {err.str()} ({err.name()})"
        + ("; retriable, try again" if err.retriable() else ""),
        code=err.name(),
    )


def log_client_error(err: KafkaError) -> None:
    """``error_cb`` of every client: client-level trouble (broker unreachable, auth failed) is
    logged; librdkafka keeps retrying and records fail through their own callbacks."""
    log.warning("kafka client error", extra={"code": err.name(), "error": err.str()})


def with_client_logging(config: dict[str, Any], package: str) -> dict[str, Any]:
    """``config`` with jobwheel's error callback and the package's throttled librdkafka logger
    (never raw ``%3|...|FAIL|`` lines on stderr), unless the caller set its own."""
    out = dict(config)
    out.setdefault("error_cb", log_client_error)
    out.setdefault("logger", librdkafka_logger(package))
    return out
