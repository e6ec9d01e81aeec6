"""The package version (one place; every layer may import it)."""

__version__ = "0.1.0"
