"""Evaluation: accuracy and TTFT of every mode on the same questions, and answer scoring."""
