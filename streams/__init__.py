"""The scheduler: faust-streaming stream processors keeping per-partition timing wheels."""
