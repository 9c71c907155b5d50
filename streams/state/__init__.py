"""Per-partition scheduler state: store ABCs (``base``), in-memory and RocksDB implementations."""
