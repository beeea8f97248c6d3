"""Tensor parallelism: sharding our decoder over ranks, the step broadcast, launching and stopping ranks."""
