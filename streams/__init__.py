"""The scheduler: an exactly-once stream processor on confluent-kafka transactions, with
per-partition RocksDB state and the timing wheels derived from it."""
