"""The package version, in its own module so that submodules read it without importing the package face."""

__version__ = "0.1.0"
