"""The protocol-neutral server core: what every API (OpenAI's, Anthropic's) shares.

Validation helpers, prompt building from template messages, the engine run and its streams,
streaming plumbing, errors as data (``APIError``), admission around a generation.  Together with
the shared server modules one level up (state, guard, diagnostics, metrics, tenants, cache info) it
knows no protocol: ``runtime/server/openai`` and ``runtime/server/anthropic`` build on it and never on
each other (an import-linter contract in pyproject.toml says so).
"""
