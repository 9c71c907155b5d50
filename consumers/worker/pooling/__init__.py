"""The worker pool, one module per concern (:mod:`jobwheel.consumers.worker.pool`)."""
