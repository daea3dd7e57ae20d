"""Layer 2, the mechanism: model facts, prompt layout, KV precompute / rotate / assemble, decode, engine."""
