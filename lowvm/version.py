"""lowvm's version (a module of its own, so the compile cache can read it without
importing the package)."""

__version__ = "0.1.0"
