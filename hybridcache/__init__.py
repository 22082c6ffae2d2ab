"""hybridcache: serve hybrid attention + recurrent LLMs without ever losing a request's state."""

__version__ = "0.1.0"
