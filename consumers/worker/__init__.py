"""The worker pool: task registry, executor and the runs-topic consumer loop."""
