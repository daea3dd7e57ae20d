"""Accuracy recovery: the cache-aware fine-tune, and the synthetic QA data it (and eval) uses."""
