"""MHGPO's credit: backward reward propagation through a pipeline, heterogeneous groups, per-agent loss weights.

Paper: "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems" (Chen et al., MHGPO),
Sec. "Multi-Agent Policy Optimization Framework", Eq. 4-7 (the intra-group similarity of its Figure 9 is a metric:
:func:`trl_multiagent.metrics.similarity.intra_group_similarity`).

The outputs of one rollout form a DAG: an output ``o_k`` of agent ``A_k`` is consumed by the outputs of its direct
successors (agents whose input contains ``o_k`` with no agent in between). Only the final outputs get a reward; it is
carried backward (Eq. 4), each agent adds its own format reward (Eq. 4, second line), advantages are normalized
inside groups whose members may have different inputs (Eq. 5), and the loss averages first within each agent and
then over agents (Eq. 6). Round-robin's singleton groups are regrouped as Algorithm 5 does (:func:`regroup_singletons`).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

from trl_multiagent.credit.group import grouped_advantages

Aggregation = str | Callable[[Sequence[float]], float]

_AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda xs: sum(xs) / len(xs),
    "max": max,
    "min": min,
}

#: The aggregation operators ``Aggr`` of Eq. 4 that can be named in a config (the paper uses ``"mean"``).
AGGREGATIONS = tuple(_AGGREGATIONS)


def resolve_aggregation(aggregate: Aggregation) -> Callable[[Sequence[float]], float]:
    """``"mean"``, ``"max"``, ``"min"`` or a callable ``f(list of rewards) -> reward``."""
    if callable(aggregate):
        return aggregate
    if aggregate not in _AGGREGATIONS:
        raise ValueError(f"Unknown reward aggregation {aggregate!r}; expected one of {list(AGGREGATIONS)} or a "
                         "callable")
    return _AGGREGATIONS[aggregate]


def propagate_rewards(consumers: Sequence[Sequence[int]], terminal_rewards: dict[int, float],
                      aggregate: Aggregation = "mean") -> list[float]:
    """Backward propagation of the shared reward through the outputs of a rollout (MHGPO Eq. 4, first line).

    ``R_shared(o_k,i) = Aggr({R_shared(o_j,r) : o_j,r consumed o_k,i, A_j a direct successor of A_k})``; the final
    outputs (no consumer) carry the reward of the system's answer.

    Args:
        consumers: ``consumers[i]`` lists the outputs that took output ``i`` as (part of) their input, all with a
            larger index (outputs are numbered in an order where every input comes before its consumer). An output
            consumed by several outputs, e.g. one Rewriter output feeding G forked Reranker outputs, lists them all.
        terminal_rewards: the shared reward of every output without consumers (the final answers).
        aggregate: ``Aggr`` of Eq. 4: ``"mean"`` (the paper), ``"max"``, ``"min"`` or a callable on the list of the
            consumers' shared rewards.

    Returns:
        The shared reward of every output, in input order.
    """
    agg = resolve_aggregation(aggregate)
    shared: list[float | None] = [None] * len(consumers)
    for i in reversed(range(len(consumers))):
        kids = list(consumers[i])
        if any(not i < c < len(consumers) for c in kids):
            raise ValueError(f"output {i} lists consumers {kids}; consumers must come after it (indices {i + 1}.."
                             f"{len(consumers) - 1})")
        if kids:
            if i in terminal_rewards:
                raise ValueError(f"output {i} has consumers {kids} and a terminal reward; only final outputs have one")
            shared[i] = float(agg([shared[c] for c in kids]))
        else:
            if i not in terminal_rewards:
                raise ValueError(f"output {i} has no consumer and no terminal reward")
            shared[i] = float(terminal_rewards[i])
    extra = set(terminal_rewards) - set(range(len(consumers)))
    if extra:
        raise ValueError(f"terminal rewards for unknown outputs {sorted(extra)}")
    return [float(s) for s in shared]


def final_rewards(shared: Sequence[float], specific: Sequence[float]) -> list[float]:
    """``R_k,i = R_shared_k,i + R_spe_k(q_k,i, o_k,i)`` (MHGPO Eq. 4, second line): the agent-specific reward (a
    format penalty in the paper) is added AFTER propagation, so it never leaks to upstream agents."""
    if len(shared) != len(specific):
        raise ValueError(f"{len(shared)} shared rewards but {len(specific)} agent-specific rewards")
    return [float(a) + float(b) for a, b in zip(shared, specific)]


def heterogeneous_group_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable],
                                   scale: str = "group") -> tuple[list[float], dict[str, float]]:
    """MHGPO Eq. 5: ``A_k,i = (R_k,i - mean{R_l,j : m_l,j = m_k,i}) / std{R_l,j : m_l,j = m_k,i}``.

    A group is every sample with the same group identifier ``m``, whatever its input: the members may come from
    different prompts (a heterogeneous group, e.g. the G Answerer outputs behind G different Rewriter outputs) or
    even different questions (Round-robin's groups of the agents before the fork point). The normalization itself is
    the one every GRPO variant here uses (:func:`~trl_multiagent.credit.group.grouped_advantages`: unbiased
    standard deviation plus ``STD_EPS``; a group of one gets advantage 0). The reward sits on the last token of the
    output (Eq. 5, cases), so the advantage is one number per output, shared by all its tokens.
    """
    return grouped_advantages(list(rewards), list(group_ids), scale=scale)


def regroup_singletons(group_ids: Sequence[Hashable], group_size: int, rng: random.Random | None = None
                       ) -> list[Hashable | None]:
    """Round-robin's regrouping of singleton groups, MHGPO Algorithm 5 (last block), as new group identifiers.

    Count every group identifier ``m``; the samples whose ``m`` appears once (P_single: in Round-robin, an agent
    before the fork point of the only question of the batch forking there) are shuffled and partitioned into
    ``N = floor(|P_single| / G)`` disjoint groups of ``G = group_size``, each given a new identifier
    (``("regrouped", i)``); every other sample keeps its identifier. The ``|P_single| mod G`` singletons left over
    belong to no group: Algorithm 5 returns only P_valid and the new groups, so they get ``None`` (the caller leaves
    them out of training). Without it a singleton group's only member gets advantage 0 (Eq. 5 over one sample):
    it stays in the batch without a learning signal.

    Example (the issue-61 case): 16 questions, one of which forks at the Reranker; its Rewriter output is the only
    member of its group. With G = 4 and no other singleton, ``N = 0``: it is left out (``None``). With G = 2 and
    the lone question's Rewriter and Answerer-side singletons, the two form one new group.
    """
    if group_size < 1:
        raise ValueError(f"group_size (G) must be at least 1, got {group_size}")
    counts: dict[Hashable, int] = defaultdict(int)
    for m in group_ids:
        counts[m] += 1
    singles = [i for i, m in enumerate(group_ids) if counts[m] == 1]
    (rng if rng is not None else random).shuffle(singles)
    out: list[Hashable | None] = list(group_ids)
    for i in singles:
        out[i] = None
    for g in range(len(singles) // group_size):
        for i in singles[g * group_size:(g + 1) * group_size]:
            out[i] = ("regrouped", g)
    return out


def agent_loss_weights(agents: Sequence[Hashable], questions: Sequence[Hashable]) -> list[float]:
    """Per-sample loss weights of MHGPO Eq. 6: ``1/n sum_k 1/G_k sum_i (loss of o_k,i)``, averaged over questions.

    For question q with n_q agents that produced samples, agent k's G_k,q samples each weigh
    ``1 / (Q * n_q * G_k,q)`` (Q questions): every agent counts equally for a question however many samples it
    produced (in Round-robin, an agent before the fork point has 1 sample, one at or after it has G), and every
    question counts equally. The weights sum to 1. The per-token mean ``1/|o|`` of Eq. 6 is the loss's own
    (``loss_type="grpo"``).
    """
    if len(agents) != len(questions):
        raise ValueError(f"{len(agents)} agents but {len(questions)} questions")
    if not agents:
        return []
    per_pair: dict[tuple, int] = defaultdict(int)
    agents_of: dict[Hashable, set] = defaultdict(set)
    for a, q in zip(agents, questions):
        per_pair[(q, a)] += 1
        agents_of[q].add(a)
    n_questions = len(agents_of)
    return [1.0 / (n_questions * len(agents_of[q]) * per_pair[(q, a)]) for a, q in zip(agents, questions)]
