"""The package version (its own module, so that lowvm's modules can read it)."""

__version__ = "0.1.0"
