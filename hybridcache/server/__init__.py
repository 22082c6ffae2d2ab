"""OpenAI-compatible HTTP server (FastAPI + uvicorn) and Prometheus metrics over the engine core.

Importing this package needs fastapi, uvicorn and prometheus_client; the library does not."""
