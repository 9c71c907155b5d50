"""Consumers of the scheduler's output: the worker pool and the status sink/service."""
