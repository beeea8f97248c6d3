"""Speculative decoding: drafts from tokens the engine has already seen, verified in one forward."""
