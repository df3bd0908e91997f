"""ollamatrio: an Ollama-compatible model server built on Trio."""

from ._version import __version__ as __version__
