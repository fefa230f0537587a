"""Task reward functions: plain functions of the agents' completions and the task's fields.

Importable from the repository root (``from rewards.matrix_game import ...``); not installed as a top-level package
(a PyPI package already owns the name ``rewards``).
"""
