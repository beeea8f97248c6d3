"""The engine: ``engine.Engine`` (the step loop and its public surface), ``async_engine.AsyncEngine``
(the loop in a thread, async streams), ``admission`` (a prompt checked and made a request),
``config.EngineConfig`` (every option and its default, once), ``outputs`` (what a step returns),
``detokenizer``, ``scoring`` (prompt logprobs) and ``stats``."""
