"""AT-GRPO's agent-wise credit and greedy transition (Stronger-MAS, Sec. 4.1, Algorithm 1, Eq. 3), and the loss
aggregation of the authors' released code (:func:`response_loss_shares`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def mix_rewards(team: float, local: float, alpha: float) -> float:
    """AT-GRPO's agent-wise credit, Eq. 3: ``r_{t,i} = alpha * r_team_t + r_local_{t,i}``."""
    return alpha * float(team) + float(local)


def best_candidate(rewards: Sequence[Mapping[str, float]]) -> int:
    """The candidate to execute: AT-GRPO's greedy transition (Algorithm 1, line 11; Sec. 4.1: "we greedily select the
    candidate with the highest reward to be the executed action"), first one on ties.

    ``rewards[k]`` maps each agent acting in candidate k to its Eq. 3 reward ``r_{t,i}`` observed when candidate k
    was scored. With one acting agent (the paper's sequential order) this is the argmax of that agent's reward. With
    several agents acting at once (the parallel order, this project's extension), candidate k is the k-th JOINT
    action, scored together, and the one executed is the joint action with the highest sum of its agents' rewards,
    ``sum_i r_{t,i} = n * alpha * r_team + sum_i r_local_i``: a joint action whose rewards were observed, never a
    combination of each agent's best candidate from different joint actions (which nobody scored).
    """
    if not rewards:
        raise ValueError("no candidates to choose from")
    totals = [sum(float(r) for r in candidate.values()) for candidate in rewards]
    return max(range(len(totals)), key=totals.__getitem__)


#: How one policy's per-token losses are averaged, and the TRL loss type that averages so in the shared update:
#: ``"seq-mean-token-mean"`` (each response's token mean, then the mean over responses: GRPO's, the default here)
#: and ``"token-mean"`` (one mean over all the policy's tokens of the step: the authors' released code, PettingLLMs).
LOSS_AGGREGATIONS = {"seq-mean-token-mean": "grpo", "token-mean": "bnpo"}


def response_loss_shares(lengths: Sequence[int], aggregation: str) -> list[float]:
    """Each response's share of one policy's loss, the loss being ``sum_i share_i * (mean of response i's per-token
    losses)``:

    * ``"seq-mean-token-mean"``: ``1 / N`` each, whatever the lengths (GRPO's per-response mean; the paper states no
      other objective, so it stays the default);
    * ``"token-mean"``: ``|o_i| / sum_j |o_j|``, i.e. every TOKEN of the batch weighs the same: PettingLLMs'
      AT-GRPO trains with verl's ``loss_agg_mode: "token-mean"`` (``pettingllms/config/ppo_trainer/base.yaml``).
      A 100-token response then weighs 10 times a 10-token one (100/110 against 10/110, instead of 1/2 each).
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"Unknown loss aggregation {aggregation!r}; expected one of {list(LOSS_AGGREGATIONS)}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"response lengths must be >= 0, got {list(lengths)}")
    if not lengths:
        return []
    if aggregation == "seq-mean-token-mean":
        return [1.0 / len(lengths)] * len(lengths)
    total = sum(lengths)
    return [n / total if total else 1.0 / len(lengths) for n in lengths]
