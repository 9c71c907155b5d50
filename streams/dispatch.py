"""Fenced dispatch: the only way scheduler output reaches Kafka.

faust's own exactly-once mode swallows transaction errors and cannot send outside the app's
topic groups (see the research notes), so fencing uses what Kafka itself offers: one
confluent-kafka transactional producer per owned partition, ``transactional.id =
<app id>-dispatch-<partition>``. When a partition moves, the new owner's ``init_transactions()``
bumps the producer epoch at the broker; from then on the old owner's produce/commit fails with a
fatal "fenced" error (:class:`~jobwheel.errors.FencedError`), and anything it had not committed
is aborted. Workers and the status sink read with ``isolation.level=read_committed``, so a
stale owner's output is never seen.

Each batch (the runs and status events of one punctuation) is one transaction: all or nothing.
The blocking librdkafka calls run on one thread per partition so the faust event loop keeps
consuming.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from jobwheel.errors import BrokerError, FencedError
from jobwheel.settings import Settings
from producers.kafka import producer_config

log = logging.getLogger(__name__)

TXN_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class Dispatcher(ABC):
    @abstractmethod
    async def claim(self, partition: int) -> None:
        """Become the producer of record for ``partition``, fencing any previous owner."""

    @abstractmethod
    async def send(self, partition: int, records: Sequence[OutRecord]) -> None:
        """Produce ``records`` atomically; raises FencedError or BrokerError, never half-sends."""

    @abstractmethod
    async def release(self, partition: int) -> None:
        """Stop producing for ``partition`` (it was revoked)."""

    @abstractmethod
    async def close(self) -> None: ...


def _raise_kafka(exc: KafkaException, what: str, partition: int) -> None:
    err: KafkaError = exc.args[0]
    code = err.name()
    if err.fatal() or err.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ):
        raise FencedError(
            f"{what} for partition {partition} was fenced ({err.str()}): a newer scheduler owns "
            "this partition now; this process stops dispatching for it",
            code=code,
        ) from exc
    raise BrokerError(f"{what} for partition {partition} failed: {err.str()}", code=code) from exc


class _PartitionProducer:
    """A transactional producer and the single thread that drives it."""

    def __init__(self, config: dict[str, object], partition: int) -> None:
        self.partition = partition
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"dispatch-{partition}"
        )
        self.producer = Producer(config)
        self.ready = False

    def init(self) -> None:
        try:
            self.producer.init_transactions(TXN_TIMEOUT_S)
        except KafkaException as exc:
            _raise_kafka(exc, "init_transactions", self.partition)
        self.ready = True

    def send(self, records: Sequence[OutRecord]) -> None:
        p = self.producer
        try:
            p.begin_transaction()
            for r in records:
                while True:
                    try:
                        p.produce(r.topic, value=r.value, key=r.key, headers=r.headers)
                        break
                    except BufferError:
                        p.poll(0.05)
            p.commit_transaction(TXN_TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.txn_requires_abort() and not err.fatal():
                try:
                    p.abort_transaction(TXN_TIMEOUT_S)
                except KafkaException:
                    log.exception("abort_transaction failed", extra={"partition": self.partition})
            _raise_kafka(exc, "dispatch transaction", self.partition)

    def close(self) -> None:
        try:
            self.producer.flush(5.0)
        finally:
            self.executor.shutdown(wait=False)


class TransactionalDispatcher(Dispatcher):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producers: dict[int, _PartitionProducer] = {}

    def _config(self, partition: int) -> dict[str, object]:
        return producer_config(
            self.settings,
            **{
                "transactional.id": f"{self.settings.scheduler_app_id}-dispatch-{partition}",
                "transaction.timeout.ms": 60_000,
                "linger.ms": 0,
            },
        )

    async def _run(self, pp: _PartitionProducer, fn, *args) -> None:  # type: ignore[no-untyped-def]
        await asyncio.get_running_loop().run_in_executor(pp.executor, fn, *args)

    async def claim(self, partition: int) -> None:
        await self.release(partition)
        pp = _PartitionProducer(self._config(partition), partition)
        self._producers[partition] = pp
        await self._run(pp, pp.init)
        log.info("claimed partition for dispatch", extra={"partition": partition})

    async def send(self, partition: int, records: Sequence[OutRecord]) -> None:
        pp = self._producers.get(partition)
        if pp is None or not pp.ready:
            raise FencedError(f"partition {partition} is not claimed by this scheduler")
        try:
            await self._run(pp, pp.send, records)
        except FencedError:
            self._producers.pop(partition, None)
            await asyncio.get_running_loop().run_in_executor(None, pp.close)
            raise

    async def release(self, partition: int) -> None:
        pp = self._producers.pop(partition, None)
        if pp is not None:
            await asyncio.get_running_loop().run_in_executor(None, pp.close)

    async def close(self) -> None:
        for partition in list(self._producers):
            await self.release(partition)
