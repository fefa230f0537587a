"""What an agent is (:class:`AgentSpec`) and the checks on a team that run before any model loads.

An :class:`AgentSpec` describes one agent: its role name, the base model it runs on, and the policy it acts with.
:func:`check_team` and :func:`check_critics` validate a whole team; :class:`~trl_multiagent.team.pool.AgentPool` loads
it. ``AgentSpec`` is imported from :mod:`trl_multiagent.team.pool` (or the package) as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trl_multiagent.models import QUANTIZATIONS
from trl_multiagent.models.loading import DEFAULT_MODEL, check_lora_targets
from trl_multiagent.team.critics import CriticSpec

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


@dataclass
class AgentSpec:
    """One agent of a team.

    Attributes:
        name: the role name; must match one of the environment's agents.
        model: hub id, local checkpoint directory or embedded short name; ``None`` is the embedded default
            (``smollm2-135m-instruct``).
        policy: the policy (adapter) this agent acts with; agents naming the same policy share it. Defaults to
            ``name`` (one policy per agent).
        quantization: ``None`` for a LoRA adapter on a full-precision base, ``"4bit"`` for QLoRA (NF4 base).
        lora_r, lora_alpha, lora_dropout, lora_target_modules: the adapter's LoRA settings.
        learning_rate: this policy's learning rate; ``None`` uses the trainer's ``learning_rate``.
        system_prompt: optional system message put before every prompt of this agent.
        use_chat_template: format prompts with the tokenizer's chat template when it has one.
        tools: TRL-style tool functions (type hints and a Google-style docstring, as TRL's ``tools=``), each a
            callable or ``"module:function"`` / ``"path/to/file.py:function"``; the prompt carries their schemas
            through the chat template and the agent's tool calls are run between its generations
            (:mod:`trl_multiagent.environments.tools`). Tools that run model-written code call the sandbox themselves
            (``trl_multiagent.sandbox.run_python``).
        max_tool_calls_per_turn: the most tool calls one response may make; a completion whose calls would exceed it
            ends there, unanswered.
        chat_template: a Jinja chat template (the text, or the path of a ``.jinja`` file) used instead of the
            tokenizer's, e.g. one that renders tools for a model whose own template does not.
    """

    name: str
    model: str | None = None
    policy: str | None = None
    quantization: str | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str | list[str] = "all-linear"
    learning_rate: float | None = None
    system_prompt: str | None = None
    use_chat_template: bool = True
    tools: list | None = None
    max_tool_calls_per_turn: int = 5
    chat_template: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"Agent name {self.name!r} must start with a letter and use letters, digits, '_' or '-'")
        if self.policy is None:
            self.policy = self.name
        if not _NAME_RE.match(self.policy) or self.policy in ("default", "ref"):
            raise ValueError(f"Policy name {self.policy!r} is not allowed (letters, digits, '_', '-'; not 'default'/'ref')")
        if self.policy in "lora_":
            raise ValueError(f"Policy name {self.policy!r} (agent {self.name!r}) is part of PEFT's parameter prefix "
                             "'lora_', so PEFT could re-initialise its weights when loading them; choose a longer name")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"Agent {self.name!r}: quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.lora_r <= 0:
            raise ValueError(f"Agent {self.name!r}: lora_r must be positive, got {self.lora_r}")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError(f"Agent {self.name!r}: learning_rate must be positive, got {self.learning_rate}")
        check_lora_targets(f"Agent {self.name!r}", self.lora_target_modules)
        if isinstance(self.max_tool_calls_per_turn, bool) or not isinstance(self.max_tool_calls_per_turn, int) \
                or self.max_tool_calls_per_turn < 0:
            raise ValueError(f"Agent {self.name!r}: max_tool_calls_per_turn must be an integer >= 0, "
                             f"got {self.max_tool_calls_per_turn!r}")
        if self.tools is not None and (isinstance(self.tools, str) or not isinstance(self.tools, (list, tuple))):
            self.tools = [self.tools]
        if self.tools:
            from trl_multiagent.environments.tools import resolve_tools

            resolve_tools(self.tools, f"Agent {self.name!r}")  # checked now, before any model loads
        if self.chat_template is not None:
            if not isinstance(self.chat_template, str) or not self.chat_template.strip():
                raise ValueError(f"Agent {self.name!r}: chat_template must be a Jinja template or a .jinja file")
            if self.chat_template.endswith(".jinja") and "{" not in self.chat_template:
                path = Path(self.chat_template).expanduser()
                if not path.is_file():
                    raise FileNotFoundError(f"Agent {self.name!r}: no chat template file {path}")

    def tool_functions(self) -> list:
        """The agent's tools as functions (specs imported once per process by :func:`~trl_multiagent.utils.
        import_object`)."""
        from trl_multiagent.environments.tools import resolve_tools

        return resolve_tools(self.tools, f"Agent {self.name!r}") if self.tools else []

    def chat_template_text(self) -> str | None:
        """The agent's own chat template (``chat_template``, read from its file when it names one)."""
        if self.chat_template is not None and self.chat_template.endswith(".jinja") and "{" not in self.chat_template:
            return Path(self.chat_template).expanduser().read_text()
        return self.chat_template

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL

    def adapter_settings(self) -> tuple:
        targets = self.lora_target_modules
        return (self.model_name, self.quantization, self.lora_r, self.lora_alpha, self.lora_dropout,
                tuple(targets) if isinstance(targets, list) else targets, self.learning_rate)



def spec_record(spec: AgentSpec) -> dict[str, Any]:
    """An agent for ``team.json``: its fields, tools as the strings that name them."""
    from trl_multiagent.environments.tools import tool_spec_string

    record = asdict(spec)
    if spec.tools:
        record["tools"] = [tool_spec_string(t) for t in spec.tools]
    return record


def check_critics(specs: Sequence[AgentSpec], critics: Sequence[CriticSpec]) -> None:
    """Critics must name agents of the team and have names distinct from each other and from every policy."""
    agents = {s.name for s in specs}
    policies = {s.policy for s in specs}
    seen: set[str] = set()
    for critic in critics:
        if critic.agent not in agents:
            raise ValueError(f"Critic {critic.name!r} names agent {critic.agent!r}, which is not in the team "
                             f"{sorted(agents)}")
        if critic.name in seen or critic.name in policies:
            raise ValueError(f"Critic name {critic.name!r} is already used by another critic or a policy")
        seen.add(critic.name)


def check_team(specs: Sequence[AgentSpec]) -> dict[str, list[AgentSpec]]:
    """Validate a team before loading anything; return the agents of every policy.

    Agent names must be unique, and agents sharing a policy must agree on everything that defines it (base model,
    quantization, LoRA settings, learning rate).
    """
    if not specs:
        raise ValueError("A team needs at least one AgentSpec")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"Agent names must be unique; repeated: {dupes}")
    by_policy: dict[str, list[AgentSpec]] = {}
    for spec in specs:
        by_policy.setdefault(spec.policy, []).append(spec)
    for policy, members in by_policy.items():
        settings = {m.adapter_settings() for m in members}
        if len(settings) > 1:
            raise ValueError(
                f"Agents {[m.name for m in members]} share policy {policy!r} but differ in model, quantization, LoRA "
                "settings or learning rate; a shared policy is one adapter on one base."
            )
    return by_policy


def check_frozen_policies(frozen: Sequence[str], policies: Sequence[str] | set[str]) -> None:
    """``frozen_policies`` (policies that act but do not learn) names policies of the team and leaves at least one to
    train; a :class:`ValueError` that says which otherwise."""
    frozen, policies = set(frozen), set(policies)
    unknown = sorted(frozen - policies)
    if unknown:
        raise ValueError(f"frozen_policies names {unknown}, which the team has no policy of; its policies are "
                         f"{sorted(policies)} (agents that share one policy freeze together)")
    if frozen and frozen >= policies:
        raise ValueError(f"frozen_policies {sorted(frozen)} freezes every policy of the team: nothing would train (a "
                         "team with one shared policy cannot freeze one agent: give each agent its own policy, "
                         "policy_mapping: specialized)")
