"""Chat templates for kvreuse: exact rendering with segments, bundled templates, output parsers, and a
prefix-stability check that tells whether a conversation renders append-only."""
