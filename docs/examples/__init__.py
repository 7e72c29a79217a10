"""Runnable examples for the docs (docs/engine.md)."""
