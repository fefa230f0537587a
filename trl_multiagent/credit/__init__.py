"""Credit assignment: the pure math of each algorithm, one module per paper.

Every function here is small, side-effect free and works on plain Python numbers or 1-D tensors, so that each
paper equation can be checked against a hand-computed example (``tests/test_credit*.py``). Trainers call these
functions; they never re-implement them.

| module | paper | what |
|---|---|---|
| ``group`` | MAGRPO Eq. 1 (shared by all GRPO variants) | group-relative advantages, normalisation by group key |
| ``magrpo`` | MAGRPO Alg. 1 | joint actions (aligned / cross), tree returns, discounted returns, generation count |
| ``at_grpo`` | AT-GRPO Eq. 3 | mixing team and local rewards |
"""

from .at_grpo import mix_rewards
from .group import STD_EPS, group_relative_advantages, grouped_advantages
from .magrpo import cross_sample_credit, discounted_returns, joint_action_indices, num_tree_generations, tree_returns

__all__ = [
    "STD_EPS",
    "cross_sample_credit",
    "discounted_returns",
    "group_relative_advantages",
    "grouped_advantages",
    "joint_action_indices",
    "mix_rewards",
    "num_tree_generations",
    "tree_returns",
]
