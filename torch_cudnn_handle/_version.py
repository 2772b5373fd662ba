"""The package version: the one place it is written (setup.py and __init__.py read it)."""

__version__ = "0.2.0"
