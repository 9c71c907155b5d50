"""Job status: the ClickHouse store and its migrations, the status sink, and the API."""
