"""Task reward functions: plain functions of the agents' completions and the task's fields, installed with the package
(``trl_multiagent.rewards.coding:cooperative_code_reward`` names one in a recipe or an environment).

| module | paper | reward |
|---|---|---|
| ``coding`` | MAGRPO Sec. 5.2 / App. C | the level-based cooperative coding reward (structure, syntax, tests, cooperation) |
| ``writing`` | MAGRPO Sec. 5.1 / App. C | structure, style consistency and coherence of the writing tasks (TLDR, arXiv) |
"""
