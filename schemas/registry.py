"""The Schema Registry behind the Confluent wire format (``JOBWHEEL_SCHEMA_REGISTRY_URL``): what
the codec needs of one, and the adapter over Confluent's client (the ``registry`` extra)."""

from __future__ import annotations

from typing import Any, Protocol

from jobwheel.errors import ConfigError, SchemaRegistryError


class SchemaRegistry(Protocol):
    """What the codec needs from a Schema Registry (tests inject an in-process one)."""

    def register(self, subject: str, schema_str: str) -> int:
        """Register (or find) ``schema_str`` under ``subject``; return its global id."""
        ...

    def lookup(self, schema_id: int) -> str | None:
        """The schema text of ``schema_id``; ``None`` if the registry does not know it."""
        ...


class ConfluentSchemaRegistry:
    """:class:`SchemaRegistry` over ``confluent_kafka.schema_registry.SchemaRegistryClient``.

    The registry client needs the ``registry`` extra (``confluent-kafka[schemaregistry]``:
    authlib, attrs, cachetools, an HTTP client); it is imported only when a registry URL is
    configured.
    """

    def __init__(self, url: str, config: dict[str, Any] | None = None) -> None:
        try:
            from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
        except ImportError as exc:
            raise ConfigError(
                "a Schema Registry URL is set but the registry client is not installed: "
                "pip install 'jobwheel[registry]' (or unset "
                "JOBWHEEL_SCHEMA_REGISTRY_URL to use single-object encoding)"
            ) from exc
        self._schema_cls = Schema
        self._client = SchemaRegistryClient({"url": url, **(config or {})})

    def register(self, subject: str, schema_str: str) -> int:
        try:
            return int(self._client.register_schema(subject, self._schema_cls(schema_str, "AVRO")))
        except Exception as exc:
            raise SchemaRegistryError(f"registering {subject} failed: {exc}") from exc

    def lookup(self, schema_id: int) -> str | None:
        try:
            return str(self._client.get_schema(schema_id).schema_str)
        except Exception as exc:
            if getattr(exc, "http_status_code", None) == 404:
                return None
            raise SchemaRegistryError(f"looking up schema id {schema_id} failed: {exc}") from exc
