"""MAPoRL's credit: verifier rewards, collaboration incentives, App. G penalties, token rewards.

Paper: "MAPoRL: Multi-Agent Post-Co-Training for Collaborative Large Language Models with Reinforcement Learning"
(Park et al., arXiv 2502.18439): Sec. 2 (Observation 1), Sec. 3.1 (Def. 1), Sec. 3.2 (token rewards; GAE and the
whitening of the advantages are :func:`~trl_multiagent.credit.returns.gae` and
:func:`~trl_multiagent.credit.returns.whiten`), Sec. 3.3 (Tables 1-2), App. F (reward modes), App. G.2-G.3
(penalties). The debate metrics (the majority vote and its tie rule of Sec. 4.1, the transitions of Sec. 4.3) are in
:mod:`trl_multiagent.metrics.debate`.

Conventions: a debate of n agents over T turns is held as ``[agent][turn]`` lists (agent i's row, turn t's column,
turns counted from 0 in code, from 1 in the paper). ``scores[i][t]`` is the verifier score ``s(q, y_{i,t})`` of
agent i's answer at turn t. The text extraction of the paper lost most symbols; each function says which reading
it implements where the prose leaves room.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from trl_multiagent.credit.returns import discounted_returns
from trl_multiagent.metrics.answers import text_after_boxed
from trl_multiagent.metrics.debate import peer_majority

REWARD_MODES = ("immediate", "cumulative", "influence")


# --------------------------------------------------------------------------------------------------- App. F, Def. 1
def _check_matrix(scores: Sequence[Sequence[float]]) -> tuple[int, int]:
    if not scores:
        raise ValueError("scores needs one row per agent")
    turns = {len(row) for row in scores}
    if len(turns) != 1:
        raise ValueError(f"every agent needs a score per turn; got rows of lengths {sorted(turns)}")
    return len(scores), turns.pop()


def immediate_rewards(scores: Sequence[Sequence[float]]) -> list[list[float]]:
    """Immediate verification reward (App. F): ``R_{i,t} = s(q, y_{i,t})``, the score of the answer itself."""
    _check_matrix(scores)
    return [[float(s) for s in row] for row in scores]


def discount_sums(num_turns: int, gamma: float) -> list[float]:
    """``D_t = sum_{t'=t..T} gamma^(t'-t)`` for every turn t (0-based, ``num_turns`` turns): the normaliser of the
    cumulative and influence-aware rewards (App. F Eq. 1, Def. 1). ``0^0 = 1``: with ``gamma = 0`` every ``D_t``
    is 1."""
    sums, running = [0.0] * num_turns, 0.0
    for t in reversed(range(num_turns)):
        running = 1.0 + gamma * running
        sums[t] = running
    return sums


def cumulative_rewards(scores: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    """Cumulative verification reward (App. F, Eq. 1), normalised by the discounts:

    ``R_{i,t} = [ sum_{t'=t..T} gamma^(t'-t) s(q, y_{i,t'}) ] / sum_{t'=t..T} gamma^(t'-t)``

    Agent i's own scores from turn t to the last turn T, discounted by ``gamma``, as a discount-weighted MEAN.
    Reading chosen: Eq. 1's symbols were lost in the text; the authors' released trainer (``score_rule`` with
    ``rule_horizon="discounted_sum"``, ``rule_agent_share="individual"``) divides the discounted sum by
    ``sum_{t'=t..T} gamma^(t'-t)``, so a reward stays on the scale of one verifier score whatever the number of
    turns left (issue 35). Without the division, early turns would get up to ``1 / (1 - gamma)`` times the reward
    of the last one.
    """
    _, turns = _check_matrix(scores)
    norm = discount_sums(turns, gamma)
    return [[r / d for r, d in zip(discounted_returns([float(s) for s in row], gamma), norm)] for row in scores]


def influence_aware_rewards(scores: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    """Influence-aware verification reward (Def. 1, App. F):

    ``R_{i,t} = [ s(q, y_{i,t}) + sum_{t'=t+1..T} gamma^(t'-t) * (1/n) sum_j s(q, y_{j,t'}) ]``
    ``/ sum_{t'=t..T} gamma^(t'-t)``

    The agent's OWN score at turn t, plus the discounted mean over all n agents (itself included) of every LATER
    turn, divided by the discount sum (:func:`discount_sums`). Reading chosen: Def. 1's symbols were lost in the
    text. Its prose says the reward "considers the verifier's score for the current solution y_{i,t}" and
    "incorporates the impact of this solution on the future answers of all agents", the expectation being over the
    other agents' answers "influenced by the agent's current response" (their later answers: the peers' answers of
    turn t are written at the same time and cannot be influenced by it); the authors' released trainer
    (``score_rule`` with ``rule_horizon="discounted_sum"``, ``rule_agent_share="all"``) computes exactly this form,
    normalisation included (issue 35). An earlier version averaged all agents at turn t as well, so an agent's own
    answer counted only 1/n and every agent of a turn got the same reward.
    """
    n, turns = _check_matrix(scores)
    team = [sum(float(scores[j][t]) for j in range(n)) / n for t in range(turns)]
    future = discounted_returns(team + [0.0], gamma)  # future[t] = sum_{t' >= t} gamma^(t'-t) team[t']
    norm = discount_sums(turns, gamma)
    return [[(float(scores[i][t]) + gamma * future[t + 1]) / norm[t] for t in range(turns)] for i in range(n)]


def verification_rewards(scores: Sequence[Sequence[float]], mode: str, gamma: float) -> list[list[float]]:
    """The reward of every answer under ``mode`` (``"immediate"``, ``"cumulative"`` or ``"influence"``; App. F)."""
    if mode == "immediate":
        return immediate_rewards(scores)
    if mode == "cumulative":
        return cumulative_rewards(scores, gamma)
    if mode == "influence":
        return influence_aware_rewards(scores, gamma)
    raise ValueError(f"Unknown reward mode {mode!r}; expected one of {REWARD_MODES}")


def fill_after_early_stop(rows: Sequence[Sequence], num_turns: int) -> list[list]:
    """Extend each agent's row (scores, answers or correctness flags) to ``num_turns`` by repeating its last entry.

    A debate of the evaluation stops early when all agents agree (Sec. 4.1); the agreed answers then stand for the
    remaining turns in the per-turn metrics (:mod:`trl_multiagent.evaluation.debate`). The training's rewards do
    not fill: a training debate plays every turn (``MAPoRLConfig.train_early_stop`` off, as the authors' configs,
    whose consensus criterion 1.1 is never met), and one that stops early anyway is rewarded over the turns it
    played, as the authors' ``score_rule`` truncates (:func:`verification_rewards` of the played columns).
    """
    out = []
    for row in rows:
        if not row:
            raise ValueError("every agent needs at least one turn")
        if len(row) > num_turns:
            raise ValueError(f"a row has {len(row)} turns, more than num_turns={num_turns}")
        out.append(list(row) + [row[-1]] * (num_turns - len(row)))
    return out


# --------------------------------------------------------------------------------------------------- Tables 1-2
@dataclass(frozen=True)
class Incentives:
    """The four collaboration incentives of Sec. 3.3 (Tables 1-2).

    Attributes:
        alpha0: own revision W -> R while the majority at t was wrong (critical reasoning).
        alpha1: own revision W -> R while the majority at t was right (persuadability).
        beta0: the majority went W -> R after the agent's wrong answer at t (a useful wrong answer).
        beta1: the majority went W -> R after the agent's right answer at t (persuasiveness).
        right_to_wrong: the tables' R -> W rows subtract the mirrored incentive (see
            :func:`collaboration_incentives`); ``False``: those rows give nothing.
    """

    alpha0: float = 0.0
    alpha1: float = 0.0
    beta0: float = 0.0
    beta1: float = 0.0
    right_to_wrong: bool = True

    @property
    def active(self) -> bool:
        return any(v != 0.0 for v in (self.alpha0, self.alpha1, self.beta0, self.beta1))


def collaboration_incentives(answers: Sequence[Sequence[Hashable | None]], correct: Sequence[Sequence[bool | float]],
                             incentives: Incentives) -> list[list[float]]:
    """The incentive added to each answer's reward (Sec. 3.3, Tables 1-2); ``[agent][turn]`` in, ``[agent][turn]`` out.

    For every agent i and turn t < T (R = right, W = wrong; ``m_t`` = :func:`peer_majority` of the other agents at
    turn t, in [0, 1]; a tie counts as right with the Sec. 4.1 expected accuracy):

    * Table 1 (own revision), added to the reward of the revised answer ``y_{i,t+1}``:
      agent i W at t and R at t+1: ``+ alpha0 * (1 - m_t) + alpha1 * m_t``;
      agent i R at t and W at t+1: ``- alpha0 * m_t - alpha1 * (1 - m_t)``.
    * Table 2 (influence), added to the reward of the influencing answer ``y_{i,t}``:
      majority W at t and R at t+1: ``+ (1 - m_t) * m_{t+1} * (beta0 if i was W at t else beta1)``;
      majority R at t and W at t+1: ``- m_t * (1 - m_{t+1}) * (beta0 if i was R at t else beta1)``.

    The R -> W rows (``Incentives.right_to_wrong``, on by default), decided from the paper and the authors' code:
    the paper's tables (text extraction) show "-" in the two R -> W rows of each table and an empty cell (a lost
    symbol) in the W -> R rows, i.e. a minus sign before a lost alpha / beta, the tables mirroring their W -> R rows.
    The authors' released trainer (``bonus_rule``) subtracts in the own-revision R -> W cells, and pairs the cells
    as above: the incentive of an independent revision (W -> R against a wrong majority, the paper's alpha0, their
    ``alpha[1]``) is also lost by leaving a right majority (R -> W, majority right), and persuadability (W -> R with
    a right majority, alpha1, their ``alpha[0]``) is lost by following a wrong majority (R -> W, majority wrong).
    Its influence block pairs the cells the same way (beta0 with "majority R -> W after the agent's right answer",
    beta1 after its wrong answer) but with both signs the other way round (it subtracts when the others go W -> R
    and adds when they go R -> W), which contradicts the paper's prose ("beta1 captures an agent's ability to
    effectively persuade others when providing correct answers"); the signs here are the paper's. With
    ``right_to_wrong=False`` the R -> W rows give nothing (this library's reading before issue 61).

    With binary majorities (two agents, or three without ties) this is exactly the table lookup; with a tie the
    majority's correctness is the probability that a uniform pick among the tied answers is right, and the
    incentive is its expectation.
    """
    n = len(answers)
    if n < 2 or len(correct) != n:
        raise ValueError("incentives need answers and correctness flags of at least two agents")
    turns = len(answers[0])
    if any(len(row) != turns for row in answers) or any(len(row) != turns for row in correct):
        raise ValueError("every agent needs an answer and a correctness flag per turn")
    column = [[answers[i][t] for i in range(n)] for t in range(turns)]
    right = [[bool(correct[i][t]) for i in range(n)] for t in range(turns)]
    out = [[0.0] * turns for _ in range(n)]
    a0, a1, b0, b1 = incentives.alpha0, incentives.alpha1, incentives.beta0, incentives.beta1
    for i in range(n):
        for t in range(turns - 1):
            m_t = peer_majority(column[t], right[t], i)
            m_next = peer_majority(column[t + 1], right[t + 1], i)
            if not right[t][i] and right[t + 1][i]:
                out[i][t + 1] += a0 * (1.0 - m_t) + a1 * m_t
            elif right[t][i] and not right[t + 1][i] and incentives.right_to_wrong:
                out[i][t + 1] -= a0 * m_t + a1 * (1.0 - m_t)
            better = (1.0 - m_t) * m_next
            if better:
                out[i][t] += better * (b1 if right[t][i] else b0)
            worse = m_t * (1.0 - m_next)
            if worse and incentives.right_to_wrong:
                out[i][t] -= worse * (b0 if right[t][i] else b1)
    return out


# --------------------------------------------------------------------------------------------------- App. G
@dataclass(frozen=True)
class PenaltySettings:
    """The reward-hacking penalties of App. G.2-G.3; a triggered penalty sets the answer's verifier score to ``value``
    (:func:`penalized_score`).

    Attributes:
        value: the penalised verifier score (the paper's "verifier score of -10").
        no_boxed: penalise an answer without ``\\boxed{...}``.
        no_eos: penalise a response cut at the length limit (no EOS token).
        min_tokens: penalise responses shorter than this many tokens (the paper: 50); 0 disables.
        repetition: penalise a run of one n-gram repeated more than ``max_repeats`` times in a row (numbers exempt).
        max_repeats: the longest allowed run of one n-gram (the paper: three).
        max_ngram: the longest n-gram checked (the paper saw 2-5 token repetitions).
        post_boxed: penalise any text after the last ``\\boxed{...}`` (whitespace and closing math delimiters
            ``$``, ``\\]``, ``\\)`` excepted).
    """

    value: float = -10.0
    no_boxed: bool = True
    no_eos: bool = True
    min_tokens: int = 50
    repetition: bool = True
    max_repeats: int = 3
    max_ngram: int = 5
    post_boxed: bool = True

    @property
    def enabled(self) -> tuple[str, ...]:
        names = [("no_boxed", self.no_boxed), ("no_eos", self.no_eos), ("short", self.min_tokens > 0),
                 ("repetition", self.repetition), ("post_boxed", self.post_boxed)]
        return tuple(name for name, on in names if on)


_NUMERIC_TOKEN = re.compile(r"^[\s\d.,:/+\-]*\d[\s\d.,:/+\-]*$")


def repeated_run(tokens: Sequence[str], max_repeats: int = 3, max_ngram: int = 5) -> bool:
    """Whether some n-gram (n <= ``max_ngram``) occurs more than ``max_repeats`` times in a row (App. G.3 "Token
    Repetition"). N-grams that spell a number (digits and separators, at least one digit) are exempt: ``1111`` or ``0.000``
    may be valid. ``tokens`` are the decoded tokens of one response."""
    if max_repeats < 1 or max_ngram < 1:
        raise ValueError("max_repeats and max_ngram must be positive")
    length = len(tokens)
    for n in range(1, max_ngram + 1):
        need = (max_repeats + 1) * n
        for start in range(0, length - need + 1):
            gram = tokens[start:start + n]
            if _NUMERIC_TOKEN.match("".join(gram)):
                continue
            if all(tokens[start + k * n:start + (k + 1) * n] == gram for k in range(1, max_repeats + 1)):
                return True
    return False


#: What may follow the final box without the post-box penalty: whitespace and closing math delimiters.
_ALLOWED_AFTER_BOX = re.compile(r"^(?:\s|\$|\\\]|\\\))*$")


def answer_penalties(text: str, tokens: Sequence[str], truncated: bool, settings: PenaltySettings) -> dict[str, bool]:
    """Which App. G penalties one response triggers: ``{name: triggered}`` for every enabled check.

    ``no_boxed`` (no ``\\boxed{}``), ``no_eos`` (cut at the length limit), ``short`` (fewer than ``min_tokens``
    tokens), ``repetition`` (:func:`repeated_run`), ``post_boxed`` (text after the box, see :class:`PenaltySettings`).
    """
    after = text_after_boxed(text)
    checks = {
        "no_boxed": lambda: after is None,
        "no_eos": lambda: bool(truncated),
        "short": lambda: len(tokens) < settings.min_tokens,
        "repetition": lambda: repeated_run(tokens, settings.max_repeats, settings.max_ngram),
        "post_boxed": lambda: after is not None and not _ALLOWED_AFTER_BOX.match(after),
    }
    return {name: bool(checks[name]()) for name in settings.enabled}


def first_turn_exempt(triggered: dict[str, bool], turn: int, exempt: bool = True) -> dict[str, bool]:
    """The App. G checks that count for an answer of ``turn`` (0-based): all of them, except a missing box at the
    first turn when ``exempt`` (collaboration training as the authors' released trainer runs it: its penalty
    condition adds the box check only ``if self.task_training or (turn != 0)``, and its debate configs train with
    ``task_training`` off). The paper (App. G.2) states the no-box penalty without exception; ``exempt=False``
    reads it so. The other checks (no EOS, short, repetition, text after the box) count at every turn."""
    if exempt and turn == 0 and triggered.get("no_boxed"):
        return {**triggered, "no_boxed": False}
    return dict(triggered)


def penalized_score(score: float, triggered: dict[str, bool], value: float) -> float:
    """App. G.2: an answer that triggers any penalty gets the verifier score ``value`` (-10); otherwise ``score``.

    Reading chosen (App. G.2: answers without ``\\boxed{}`` "are penalized with a verifier score of -10"; the authors'
    released trainer replaces the answer's score by ``penalty_reward_value`` before ``score_rule`` aggregates the
    scores): the penalty replaces the answer's VERIFIER SCORE ``s(q, y_{i,t})``, which then enters every reward that
    aggregates it like any other score: the answer's own cumulative or influence-aware reward, the cumulative rewards
    of the agent's earlier answers, and the influence-aware rewards of every agent's earlier answers (through the
    mean over agents of its turn). An earlier version replaced only the penalised answer's final reward.
    """
    return float(value) if any(triggered.values()) else float(score)


# --------------------------------------------------------------------------------------------------- Sec. 3.2
def token_level_rewards(logps: Sequence[float], ref_logps: Sequence[float], score: float,
                        kl_coef: float) -> list[float]:
    """Per-token reward of one response (Sec. 3.2): ``r_k = -kl_coef * (log pi(y_k) - log pi_ref(y_k))`` for every
    token k, plus the answer's reward ``score`` on the last token."""
    if len(logps) != len(ref_logps):
        raise ValueError(f"{len(logps)} log-probs but {len(ref_logps)} reference log-probs")
    if not logps:
        raise ValueError("a response needs at least one token")
    rewards = [-kl_coef * (float(lp) - float(rp)) for lp, rp in zip(logps, ref_logps)]
    rewards[-1] += float(score)
    return rewards


# --------------------------------------------------------------------------------------------------- Sec. 2
def best_response_threshold(reward_collaborate: float, reward_independent: float, synergy: float) -> float:
    """Observation 1 (Sec. 2.2, App. C), two turns and threshold 2: against a partner who collaborates with
    probability q, collaborating first is optimal iff ``q > (r_I - r_C) / (R - r_I)``; this returns that bound."""
    if not reward_collaborate < reward_independent < synergy:
        raise ValueError("the game needs r_C < r_I < R")
    return (reward_independent - reward_collaborate) / (synergy - reward_independent)
