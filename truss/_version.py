"""The version of Truss (a leaf: modules that record it need not import the ``truss`` package)."""

__version__ = "0.1.0"
