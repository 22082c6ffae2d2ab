"""Requests, scheduling policy, speculative drafters, the runner and the `LLM` facade."""
