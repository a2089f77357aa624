"""The modules the scenarios build: the transformer block and the KV caches."""
