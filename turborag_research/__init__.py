"""The research that made the shipped adapter and the numbers of docs/BENCHMARKS.md, apart from the runtime.

Data generators: `synth` (invented facts), `realtext` (stdlib docstrings), `prose` (plain-English questions
over them), `docstyle` (documentation layout), `families` (template families of the synthetic questions),
`mix` (the fine-tune's training mix and its held-out sets), `text` (the text checks they share); `recipe`
builds a recipe's data with them and hands the run to the runtime's trainer (turborag/train/finetune.py).
`experiments/` holds the runners of BENCHMARKS' experiments (`python -m turborag_research.experiments.NAME`).

The runtime (`turborag`) never imports this package at module level: only the `turborag data` commands that
generate data and `turborag finetune --recipe` import it, inside the command. A recipe that records
`data_sha256` tells when the generators no longer reproduce its data (recipe.py), instead of freezing them.
"""
