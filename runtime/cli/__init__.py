"""The ``kvreuse`` command: ``main`` (generate, chat, and the dispatch to serve / bench /
template-check / cache) and
``cache`` (``kvreuse cache save|load|inspect|clear``)."""
