"""Accuracy recovery: the cache-aware fine-tune (finetune.py), on a given data file. The generators that
made the shipped adapter's data are research code, apart from the runtime: turborag_research/."""
