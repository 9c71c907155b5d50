"""The scheduler's processor: one module per kind of rule (:mod:`jobwheel.streams.processor`)."""
