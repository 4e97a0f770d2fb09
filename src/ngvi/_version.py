"""The package version, in a module of its own so that the library's modules can read it without importing
the package (``ngvi.__version__`` is this)."""

__version__ = "0.1.0"
