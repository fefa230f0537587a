"""Building blocks of the task rewards: measures, gates and their compositions over a task's settings.

The task reward functions that recipes name live at the repository's top level, in ``rewards/`` (``reward_fn:
rewards/writing.py:tldr_reward`` in a recipe's ``env_kwargs``); each is one of the compositions below over its
paper's settings. The environments default to the same compositions, so an installed package (which has no
``rewards/``) scores exactly as the recipes do. docs/architecture.md ("Task rewards") says why.

| module | paper | blocks | composition (the environment's default) |
|---|---|---|---|
| ``coding`` | MAGRPO App. C, CoLLM App. F.2 | :func:`~.coding.analyze` (static facts), :data:`~.coding.WEIGHTS` | :func:`~.coding.level_reward` |
| ``writing`` | MAGRPO App. C, CoLLM App. F.1 | length and unique-word ratios, bands, capped Jaccard, transition categories, coherence | :func:`~.writing.writing_reward` over :data:`~.writing.TLDR` / :data:`~.writing.ARXIV` |

May import: nothing of the library.
"""
