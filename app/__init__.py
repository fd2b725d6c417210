"""Transformer Explorer's web layer: a JSON API and htmx pages over one service layer."""

__version__ = "0.1.0"
