"""Client-side benchmarks; `serve` drives any OpenAI-compatible endpoint (`hybridcache bench serve`)."""
