"""Training a DFlash drafter for a llama.cpp GGUF target (optional extra: ``pip install pydflash[train]``).

Stages: ``prepare`` (prompts, CPU) -> ``pipeline`` (responses, features, training, evaluation; one GPU)
-> ``export_gguf`` (llama.cpp dflash GGUF). ``scripts/train_drafter.sh`` runs them end to end; see docs/drafter.md.
"""
