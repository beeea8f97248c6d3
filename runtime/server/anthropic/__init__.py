"""The Anthropic Messages API (``/v1/messages``) over the same engine, templates and cache as the OpenAI routes."""
