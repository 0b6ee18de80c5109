"""The package version, written into every run's ``runs`` row."""

__version__ = "0.1.0"
