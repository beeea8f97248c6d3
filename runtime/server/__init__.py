"""OpenAI-compatible HTTP server for agents: chat/completions with honest cache figures and
cache-miss diagnostics, Prometheus metrics, bounded admission and graceful shutdown."""
