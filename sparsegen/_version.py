"""The package version, in a module of its own: the stages that stamp it (render's provenance
header, the cache keys, the rates files) import it without importing the package."""
__version__ = "0.1.0"
