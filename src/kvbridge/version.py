"""The package version, in a module of its own so low modules can stamp it without importing the package root."""

__version__ = "0.1.0"
