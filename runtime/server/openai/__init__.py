"""The OpenAI API (chat completions, completions, models, the cache routes) over the neutral core."""
