"""The machinery shared by the tool+plan game environments (AT-GRPO Appendix C.2 and D workflows).

Every game is a two-agent team that acts in this order within a turn:

1. ``tool`` writes Python code. The environment prepends a short preamble defining the task's variables (for
   instance ``grid``), runs the program in the sandbox (:func:`trl_multiagent.sandbox.run_python`) and parses its
   stdout as a *proposal* (a move list or a grid). The environment state does not change.
2. ``plan`` reads the task, the tool's code and its output, and writes the final answer in a fixed format
   (``ACTIONS: ...`` or ``ANSWER: ...``). The answer is applied to the state; the turn counter advances.

The episode ends when the game is solved or after ``max_turns`` plan answers.

``step`` accepts a partial joint action (``{"tool": ...}`` or ``{"plan": ...}``, as sequential AT-GRPO does when it
scores each agent's candidates on a clone) and the full joint action (``{"tool": ..., "plan": ...}``, parallel
order: both act on the same state, the plan without this turn's tool output).

Rewards (AT-GRPO Appendix B): the sampler mixes them as ``r_i = alpha * team + local_i`` (Eq. 3).

* A plan step's team reward scores the state change of the plan's answer.
* A tool-only step leaves the state alone; its team reward is the team reward the proposal WOULD earn if the plan
  executed it verbatim now (a counterfactual on a copy of the state), so that tool candidates are ranked by the
  same team signal as plan candidates.
* Local rewards are masked convex combinations of component scores in ``[0, 1]`` (the form of Appendix B)::

      local_i = sum_k m_k * w_k * s_k / sum_k m_k * w_k      (0 when every mask is 0)

  where ``w_k`` are fixed weights, ``s_k`` the component scores and ``m_k`` in {0, 1} says whether component ``k``
  applies at this step. A failed earlier stage (the code did not run, the answer did not parse) gives 0 to the
  components that depend on it; it does not mask them, so a worse output never scores higher.
* ``reward_mode="outcome"`` (Appendix B.6): the team reward is the success indicator ``1[solved]`` and each acting
  agent's local reward is ``1[its output is validly formatted]``: for the plan, its answer parses; for the tool,
  its code ran to the end and its stdout parses as a proposal.

Alone (the held-out evaluation's baselines, :meth:`ToolPlanGameEnv.score_alone`): ``plan_alone`` is one plan step
on the initial state; ``tool_alone`` runs the tool's program and executes its proposal verbatim, as the plan would,
``success`` being whether that solves the game; ``plan_alone_turns`` (``alone_multi_turn``) is the plan agent alone
for the whole turn budget, each answer applied to the state its previous one left.

The text extraction of the paper lost the coefficients of Appendix B, so the weights in each game's docstring are
this library's choice; the components follow the paper's descriptions.

``info`` (logged by the samplers as ``env/<key>``): ``success`` (the state is solved after this step),
``valid_format`` (every acting agent's output is validly formatted), ``partial`` (1 on a tool-only step),
``reward/team``, ``reward/<agent>``, and the components as ``team/<name>``, ``plan/<name>``, ``tool/<name>``.

Data: each game's ``make_dataset(num_tasks, seed, split)`` generates instances procedurally. Train and eval draw
from separate random streams (the stream name contains the split), and, so that no seed or size can ever make them
overlap, an instance belongs to a split by a hash of its canonical encoding: it is an eval instance when
``sha256(game + ":" + encoding) mod 100 < EVAL_PERCENT`` and a train instance otherwise; a generator discards the
instances of the other split (and duplicates inside a dataset).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_bool, need_int, need_tasks, sandbox_settings
from trl_multiagent.environments.coding import extract_code
from trl_multiagent.sandbox import SandboxConfig, SandboxResult, run_python

logger = logging.getLogger(__name__)

TOOL, PLAN = "tool", "plan"
EVAL_PERCENT = 20
REWARD_MODES = ("shaped", "outcome")
SPLITS = ("train", "eval")

#: Longest tool code / stdout shown in the plan agent's prompt (characters).
MAX_CODE_IN_PROMPT = 1500
MAX_OUTPUT_IN_PROMPT = 400


# --------------------------------------------------------------------------------------------------- rewards
def masked_convex(components: Mapping[str, tuple[float, float, bool]]) -> float:
    """``sum m*w*s / sum m*w`` over ``{name: (weight, score, mask)}``; 0.0 when nothing applies."""
    num = sum(w * s for w, s, m in components.values() if m)
    den = sum(w for w, _, m in components.values() if m)
    return num / den if den > 0 else 0.0


# --------------------------------------------------------------------------------------------------- splits
def split_of_encoding(game: str, encoding: str) -> str:
    """``"eval"`` or ``"train"``: the split an instance with this canonical encoding belongs to."""
    digest = hashlib.sha256(f"{game}:{encoding}".encode()).hexdigest()
    return "eval" if int(digest, 16) % 100 < EVAL_PERCENT else "train"


def stream_rng(game: str, split: str, seed: int) -> random.Random:
    """The random stream of one (game, split, seed); string seeds are hashed with SHA-512 (stable across runs)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return random.Random(f"trl_multiagent.games/{game}/{split}/{int(seed)}")


def generate_split(game: str, num_tasks: int, seed: int, split: str, draw: Callable[[random.Random], dict | None],
                   encode: Callable[[dict], str], split_key: Callable[[dict], str] | None = None,
                   max_attempts: int | None = None) -> list[dict]:
    """Draw instances from the split's stream until ``num_tasks`` distinct ones of that split are found.

    ``draw(rng)`` returns a task dict (or ``None`` to reject); ``encode(task)`` its canonical encoding, which
    removes duplicates. ``split_key(task)`` (default: ``encode``) is what :func:`split_of_encoding` hashes; a game
    may hash something else only when equal instances always have equal keys and instances of different keys
    always differ (for example the unique solution of a puzzle).
    """
    if num_tasks < 0:
        raise ValueError(f"num_tasks must be >= 0, got {num_tasks}")
    rng = stream_rng(game, split, seed)
    seen: set[str] = set()
    rows: list[dict] = []
    limit = max_attempts if max_attempts is not None else 200 * num_tasks + 1000
    attempts = 0
    while len(rows) < num_tasks:
        attempts += 1
        if attempts > limit:
            raise RuntimeError(f"{game}: found only {len(rows)} of {num_tasks} distinct {split} instances in "
                               f"{limit} draws; ask for fewer tasks or larger instances")
        task = draw(rng)
        if task is None:
            continue
        enc = encode(task)
        if enc in seen or split_of_encoding(game, (split_key or encode)(task)) != split:
            continue
        seen.add(enc)
        rows.append({"task_id": f"{game}/{split}/{seed}/{len(rows)}", "split": split, **task})
    return rows


# --------------------------------------------------------------------------------------------------- parsing
_MOVE_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}
_WORD = re.compile(r"[A-Za-z]+")


def _after_last_marker(text: str, marker: str) -> str | None:
    """The text after the last ``marker:`` (case-insensitive), or ``None`` when there is none."""
    hits = list(re.finditer(rf"{marker}\s*:", text, flags=re.I))
    return text[hits[-1].end():] if hits else None


def parse_moves(text: str, marker: str = "ACTIONS", from_stdout: bool = False, max_moves: int = 200) -> list[str] | None:
    """A move list (``["U", "R", ...]``) from a response or from a program's stdout; ``None`` when there is none.

    The moves are read after the last ``ACTIONS:`` on that line (or on the next non-empty line when the marker ends
    its line). From stdout without a marker, the last non-empty line is read. Tokens are words of letters: ``up``/
    ``down``/``left``/``right`` (any case) are one move, a word made only of the letters U/D/L/R (any case) is one
    move per letter; reading stops at the first other word (trailing prose is ignored). No move at all, or more
    than ``max_moves``, is ``None``.
    """
    if not isinstance(text, str):
        return None
    tail = _after_last_marker(text, marker)
    if tail is None:
        if not from_stdout:
            return None
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            return None
        line = lines[-1]
    else:
        lines = tail.split("\n")
        line = lines[0]
        if not line.strip():
            line = next((ln for ln in lines[1:] if ln.strip()), "")
    moves: list[str] = []
    for word in _WORD.findall(line):
        lower = word.lower()
        if lower in _MOVE_WORDS:
            moves.append(_MOVE_WORDS[lower])
        elif set(word.upper()) <= set("UDLR"):
            moves.extend(word.upper())
        else:
            break
        if len(moves) > max_moves:
            return None
    return moves or None


def parse_grid(text: str, size: int, marker: str = "ANSWER", from_stdout: bool = False) -> list[list[int]] | None:
    """A ``size x size`` grid of digits (0 = empty) from a response or a program's stdout; ``None`` if there is none.

    The first ``size * size`` digits after the last ``ANSWER:`` are read row by row (any separators); each must be
    in ``0..size``. From stdout without a marker, the stdout must contain exactly ``size * size`` digits.
    """
    if not isinstance(text, str):
        return None
    tail = _after_last_marker(text, marker)
    if tail is None:
        if not from_stdout:
            return None
        digits = re.findall(r"\d", text)
        if len(digits) != size * size:
            return None
    else:
        digits = re.findall(r"\d", tail)[: size * size]
        if len(digits) < size * size:
            return None
    values = [int(d) for d in digits]
    if any(v > size for v in values):
        return None
    return [values[r * size:(r + 1) * size] for r in range(size)]


# --------------------------------------------------------------------------------------------------- sandbox
_RUN_CACHE: OrderedDict[tuple, SandboxResult] = OrderedDict()
_RUN_CACHE_LOCK = threading.Lock()
_RUN_CACHE_SIZE = 512


def run_tool_program(program: str, config: SandboxConfig, cache: bool = True) -> SandboxResult:
    """Run a tool program in the sandbox, reusing the result of an identical earlier run (same program, same limits).

    Samplers often step the same candidate twice (once to score it, once to execute it); the cache avoids a second
    sandbox start. Programs that read randomness without a seed may differ between runs; caching fixes one outcome.
    """
    key = (program, repr(config))
    if cache:
        with _RUN_CACHE_LOCK:
            hit = _RUN_CACHE.get(key)
            if hit is not None:
                _RUN_CACHE.move_to_end(key)
                return copy.deepcopy(hit)
    result = run_python(program, config)
    if cache and result.status != "timed_out":  # a timeout may be the machine's load, not the program
        with _RUN_CACHE_LOCK:
            _RUN_CACHE[key] = copy.deepcopy(result)
            while len(_RUN_CACHE) > _RUN_CACHE_SIZE:
                _RUN_CACHE.popitem(last=False)
    return result


def _clip(text: str, limit: int) -> str:
    text = text.strip("\n")
    return text if len(text) <= limit else text[:limit] + "\n...(cut)"


@dataclass
class ToolReport:
    """What the tool agent's response produced: its code, the sandbox run and the parsed proposal."""

    code: str
    status: str
    stdout: str
    message: str
    proposal: Any = None
    outcome: Any = None  # the game's simulation of the proposal from the state the tool saw

    @property
    def ran(self) -> bool:
        return self.status == "passed"

    @property
    def parsed(self) -> bool:
        return self.proposal is not None

    def describe(self) -> str:
        """The tool's code and output, as the plan agent sees them."""
        out = _clip(self.stdout, MAX_OUTPUT_IN_PROMPT) or "(nothing)"
        lines = [f"Tool code:\n```python\n{_clip(self.code, MAX_CODE_IN_PROMPT) or '(none)'}\n```",
                 f"Tool output ({self.status}):\n{out}"]
        if self.message and not self.ran:
            lines.append(f"Error: {_clip(self.message, 200)}")
        return "\n".join(lines)


@dataclass
class Scored:
    """One agent's scored output: its local reward, whether it is validly formatted and its components."""

    local: float
    valid_format: bool
    components: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------- environment
class ToolPlanGameEnv(Environment):
    """Base class of the tool+plan games; subclasses implement the game hooks below.

    Args:
        max_turns: the turn budget (plan answers per episode).
        reward_mode: ``"shaped"`` (Appendix B.3-B.5) or ``"outcome"`` (Appendix B.6).
        sandbox: limits of the tool's sandboxed runs (a :class:`SandboxConfig` or its fields); default: 5 s wall
            clock, 256 MiB per process, 64 KiB of output.
        cache_tool_runs: reuse the sandbox result of an identical program (see :func:`run_tool_program`).
    """

    agents = (TOOL, PLAN)
    max_turns = 4
    concurrent_steps = True  # the tool's step waits on a sandbox subprocess
    supports_partial_actions = True
    game = "game"
    #: The plan agent alone can play a whole episode (its steps advance the turn); the tool's cannot.
    alone_multi_turn = (PLAN,)

    def __init__(self, max_turns: int = 4, reward_mode: str = "shaped",
                 sandbox: SandboxConfig | Mapping[str, Any] | None = None, cache_tool_runs: bool = True):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        self.reward_mode = reward_mode
        self.sandbox = sandbox_settings(sandbox, {"timeout_s": 5.0, "memory_mb": 256, "max_output_bytes": 64 << 10})
        self.cache_tool_runs = need_bool("cache_tool_runs", cache_tool_runs)
        self.task: dict[str, Any] = {}
        self.turn = 0
        self.done = False
        self.tool_report: ToolReport | None = None  # this turn's tool output, shown to the plan agent
        self.feedback = ""  # what happened at the last plan step

    # ---------------------------------------------------------------- hooks (per game)
    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        """The canonical encoding of an instance (identical instances, identical strings)."""
        raise NotImplementedError

    def load(self, task: Mapping[str, Any]) -> None:
        """Set the initial state from a dataset row."""
        raise NotImplementedError

    def render(self) -> str:
        """The task and the current state, for prompts."""
        raise NotImplementedError

    def tool_instructions(self) -> str:
        raise NotImplementedError

    def plan_instructions(self) -> str:
        raise NotImplementedError

    def preamble(self) -> str:
        """Python code defining the task's variables, run before the tool's code."""
        raise NotImplementedError

    def parse(self, text: str, from_stdout: bool) -> Any:
        """A proposal/answer from text, or ``None``."""
        raise NotImplementedError

    def simulate(self, answer: Any) -> Any:
        """The outcome of applying ``answer`` (``None`` = unparsable) to the current state, without changing it."""
        raise NotImplementedError

    def commit(self, outcome: Any) -> None:
        """Make ``outcome`` the current state."""
        raise NotImplementedError

    def solved(self) -> bool:
        raise NotImplementedError

    def outcome_solves(self, outcome: Any) -> bool:
        raise NotImplementedError

    def team_components(self, outcome: Any) -> tuple[float, dict[str, float]]:
        """Shaped team reward of an outcome and its named parts."""
        raise NotImplementedError

    def plan_components(self, outcome: Any) -> dict[str, tuple[float, float, bool]]:
        """``{name: (weight, score, mask)}`` of the plan's shaped local reward."""
        raise NotImplementedError

    def tool_components(self, report: ToolReport) -> dict[str, tuple[float, float, bool]]:
        """``{name: (weight, score, mask)}`` of the tool's shaped local reward."""
        raise NotImplementedError

    def describe_outcome(self, outcome: Any) -> str:
        """One or two lines on what the plan's answer did (next turn's feedback)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.task = dict(task)
        self.turn, self.done = 0, False
        self.tool_report, self.feedback = None, ""
        self.load(self.task)
        return self.prompts()

    def prompts(self) -> dict[str, str]:
        state = self.render()
        budget = f"Turn {self.turn + 1} of {self.max_turns}."
        feedback = f"\nLast turn: {self.feedback}" if self.feedback else ""
        tool = f"{state}{feedback}\n{budget}\n{self.tool_instructions()}"
        if self.tool_report is not None:
            seen = self.tool_report.describe()
        else:
            seen = "The tool agent has not answered this turn."
        plan = f"{state}{feedback}\n{budget}\n{seen}\n{self.plan_instructions()}"
        return {TOOL: tool, PLAN: plan}

    def run_tool(self, response: str) -> ToolReport:
        """Extract the tool's code, run it after the preamble in the sandbox, parse and simulate its proposal."""
        code = extract_code(response if isinstance(response, str) else "").strip("\n")
        if not code.strip():
            report = ToolReport(code="", status="no_code", stdout="", message="no code in the response")
        else:
            result = run_tool_program(self.preamble() + "\n" + code + "\n", self.sandbox, cache=self.cache_tool_runs)
            report = ToolReport(code=code, status=result.status, stdout=result.stdout, message=result.message)
            report.proposal = self.parse(result.stdout, from_stdout=True)
        report.outcome = self.simulate(report.proposal)
        return report

    def _score_tool(self, report: ToolReport) -> Scored:
        valid = report.ran and report.parsed
        if self.reward_mode == "outcome":
            return Scored(float(valid), valid, {"ran": float(report.ran), "parsed": float(report.parsed)})
        parts = self.tool_components(report)
        return Scored(masked_convex(parts), valid, {k: float(s) for k, (_, s, _) in parts.items()})

    def _score_plan(self, outcome: Any, valid: bool) -> Scored:
        if self.reward_mode == "outcome":
            return Scored(float(valid), valid, {"format": float(valid)})
        parts = self.plan_components(outcome)
        return Scored(masked_convex(parts), valid, {k: float(s) for k, (_, s, _) in parts.items()})

    def _team(self, outcome: Any) -> tuple[float, dict[str, float]]:
        if self.reward_mode == "outcome":
            success = float(self.outcome_solves(outcome))
            return success, {"success": success}
        return self.team_components(outcome)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended; reset it first")
        unknown = set(joint_action) - set(self.agents)
        if unknown or not joint_action:
            raise ValueError(f"{type(self).__name__}.step expects actions of {list(self.agents)} (any non-empty "
                             f"subset), got {sorted(joint_action)}")
        info: dict[str, float] = {}
        local: dict[str, float] = {}
        valid: list[bool] = []
        if TOOL in joint_action:
            report = self.run_tool(joint_action[TOOL])
            scored = self._score_tool(report)
            local[TOOL] = scored.local
            valid.append(scored.valid_format)
            info.update({f"tool/{k}": v for k, v in scored.components.items()})
            info["tool/valid_format"] = float(scored.valid_format)
            self.tool_report = report
        if PLAN in joint_action:
            answer = self.parse(joint_action[PLAN], from_stdout=False)
            outcome = self.simulate(answer)
            team, team_parts = self._team(outcome)
            scored = self._score_plan(outcome, answer is not None)
            local[PLAN] = scored.local
            valid.append(scored.valid_format)
            info.update({f"plan/{k}": v for k, v in scored.components.items()})
            info["plan/valid_format"] = float(scored.valid_format)
            self.commit(outcome)
            self.turn += 1
            tool_note = ""
            if self.tool_report is not None:
                tool_note = f"The tool's proposal {'parsed' if self.tool_report.parsed else 'did not parse'}. "
            self.feedback = tool_note + self.describe_outcome(outcome)
            self.tool_report = None
            self.done = self.solved() or self.turn >= self.max_turns
            info["partial"] = 0.0
        else:  # tool only: the counterfactual team reward of its proposal, state unchanged
            team, team_parts = self._team(self.tool_report.outcome)
            info["partial"] = 1.0
        info.update({f"team/{k}": float(v) for k, v in team_parts.items()})
        info["success"] = float(self.solved())
        info["valid_format"] = float(all(valid))
        info["reward/team"] = float(team)
        info.update({f"reward/{a}": v for a, v in local.items()})
        return StepResult(team_reward=float(team), next_prompts=None if self.done else self.prompts(),
                          done=self.done, local_rewards=local, info=info)

    def score_alone(self, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
        """``agent``'s first-turn ``response`` on ``task`` as the team's answer (the ``<agent>_alone`` baselines):
        the plan's answer applied to the initial state (one plan step), or the tool's proposal executed verbatim:
        the tool-only step (its team reward is already that counterfactual) with ``success`` the proposal's."""
        if agent not in self.agents:
            raise ValueError(f"{type(self).__name__} has the agents {list(self.agents)}, not {agent!r}")
        self.reset(task)
        result = self.step({agent: response})
        if agent == TOOL:
            result.info["success"] = float(self.outcome_solves(self.tool_report.outcome))
            result.done, result.next_prompts = True, None
        return result

    # ---------------------------------------------------------------- data
    @classmethod
    def draw(cls, rng: random.Random, **options: Any) -> dict | None:
        """One random instance (a dataset row without ``task_id``/``split``), or ``None`` to reject."""
        raise NotImplementedError

    @classmethod
    def make_rows(cls, num_tasks: int, seed: int = 0, split: str = "train", **options: Any) -> list[dict]:
        """:meth:`make_dataset` as a list of dicts (no ``datasets`` import)."""
        return generate_split(cls.game, num_tasks, seed, split, lambda rng: cls.draw(rng, **options), cls.encode)

    @classmethod
    def make_dataset(cls, num_tasks: int = 256, seed: int = 0, split: str = "train", **options: Any):
        """``num_tasks`` distinct generated instances of ``split`` (``"train"`` or ``"eval"``) as a ``Dataset``."""
        from datasets import Dataset

        need_tasks(num_tasks)

        rows = cls.make_rows(num_tasks, seed, split, **options)
        logger.info("%s: generated %d %s instances (seed %d)", cls.game, len(rows), split, seed)
        return Dataset.from_list(rows)


def check_options(name: str, values: Sequence[int], allowed: Sequence[int]) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if not values or any(v not in allowed for v in values):
        raise ValueError(f"{name} must be a non-empty subset of {tuple(allowed)}, got {values}")
    return values
