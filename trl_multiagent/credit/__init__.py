"""Credit assignment: the pure math of each algorithm, one module per paper.

Every function here is small, side-effect free and works on plain Python numbers or 1-D tensors, so that each
paper equation can be checked against a hand-computed example (``tests/test_credit*.py``). Trainers call these
functions; they never re-implement them.

| module | paper | what |
|---|---|---|
| ``group`` | MAGRPO Eq. 1 (shared by all GRPO variants) | group-relative advantages, normalisation by group key |
| ``returns`` | MAGRPO Alg. 1 (used by every trainer), MAPoRL Sec. 3.2 | tree and discounted returns (the one returns computation), GAE, whitening |
| ``magrpo`` | MAGRPO Alg. 1, Eq. 2 | joint actions (aligned / cross), cross-joint-action credit, generation count, per-turn loss weights |
| ``at_grpo`` | AT-GRPO Alg. 1, Eq. 3 | mixing team and local rewards, the greedy choice of the executed candidate |
| ``collm`` | CoLLM Eq. 2-5 | TD(0) targets and TD-error advantages |
| ``maporl`` | MAPoRL Def. 1, Tables 1-2, App. F-G, Sec. 3.2 | reward modes, incentives, penalties, token rewards |
| ``mhgpo`` | MHGPO Eq. 4-6 | backward reward propagation, heterogeneous groups, per-agent loss weights |

The trainers call them from one hook, ``assign_credit(experience)``, right after every rollout; metrics that only
score a rollout (the debate's majority vote, MHGPO's group similarity) are in :mod:`trl_multiagent.metrics`.

May import: :mod:`trl_multiagent.metrics` (answers, debate metrics) and :mod:`trl_multiagent.errors`; ``losses`` holds
the policy and value losses the trainers minimise (pure functions too).
"""

from trl_multiagent.credit.at_grpo import best_candidate, mix_rewards
from trl_multiagent.credit.collm import episode_td, normalize_per_turn, td_errors, td_targets
from trl_multiagent.credit.group import STD_EPS, group_relative_advantages, grouped_advantages
from trl_multiagent.credit.magrpo import (
    cross_sample_credit,
    joint_action_indices,
    num_tree_generations,
    turn_loss_weights,
)
from trl_multiagent.credit.maporl import verification_rewards
from trl_multiagent.credit.mhgpo import (
    agent_loss_weights,
    final_rewards,
    heterogeneous_group_advantages,
    propagate_rewards,
)
from trl_multiagent.credit.returns import discounted_returns, gae, tree_returns, whiten, whiten_groups

__all__ = [
    "STD_EPS",
    "agent_loss_weights",
    "best_candidate",
    "final_rewards",
    "heterogeneous_group_advantages",
    "propagate_rewards",
    "cross_sample_credit",
    "discounted_returns",
    "episode_td",
    "gae",
    "group_relative_advantages",
    "grouped_advantages",
    "joint_action_indices",
    "mix_rewards",
    "normalize_per_turn",
    "num_tree_generations",
    "td_errors",
    "td_targets",
    "tree_returns",
    "turn_loss_weights",
    "verification_rewards",
    "whiten",
    "whiten_groups",
]
