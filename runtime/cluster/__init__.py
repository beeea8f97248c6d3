"""Replicas behind a gateway, sharing a KV store: the processes of a cluster (docs/scaling.md)."""
