"""The package version, in a leaf module: code that records it imports this, never the package root."""

__version__ = "0.1.0"
