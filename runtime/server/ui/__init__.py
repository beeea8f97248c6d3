"""The live page (``/ui``): recent requests, their cache breaks, pins, tiers (see routes.py)."""
