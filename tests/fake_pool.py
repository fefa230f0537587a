"""A stand-in for AgentPool that answers from a script, to test rollout logic without a model."""

from __future__ import annotations

from trl_multiagent.agents import Generation


class ScriptedPool:
    """``script(agent, prompt, k) -> text``; records every generate call."""

    def __init__(self, agents, script, policies=None):
        self.agent_names = list(agents)
        self.script = script
        self.policies = policies or {a: a for a in agents}
        self.calls: list[tuple[str, int, int]] = []  # (agent, number of prompts, samples per prompt)

    def policy_of(self, agent):
        return self.policies[agent]

    def generate(self, agent, prompts, num_samples, generation_config):
        self.calls.append((agent, len(prompts), num_samples))
        out = []
        for p in prompts:
            group = []
            for k in range(num_samples):
                text = self.script(agent, p, k)
                group.append(Generation(prompt_ids=[len(str(p))], completion_ids=[ord(c) for c in text] or [0],
                                        text=text))
            out.append(group)
        return out

    def generate_by_agent(self, prompts, num_samples, generation_config):
        """The team-level call of AgentPool, answered agent by agent (each recorded as one call)."""
        return {agent: self.generate(agent, list(ps), num_samples, generation_config) for agent, ps in prompts.items()}

    @property
    def num_generations(self) -> int:
        return sum(n * k for _, n, k in self.calls)
