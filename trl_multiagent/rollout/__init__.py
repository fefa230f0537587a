"""Rollout engines ("samplers"): how a team explores an environment and what experience it keeps.

A sampler turns a batch of tasks into :class:`Experience`: one :class:`Sample` per (agent, turn, sampled response)
with its token ids, the group it is compared within, and its reward, return and advantage. The advantages come from
the pure functions of :mod:`trl_multiagent.credit`. One module per rollout topology:

| module | sampler | paper |
|---|---|---|
| ``joint_tree`` | :class:`JointTreeSampler` | MAGRPO: tree of joint actions, joint groups per node |
| ``agent_turn`` | :class:`AgentTurnSampler` | AT-GRPO: (instance, turn, agent) groups, greedy tree sampling |
"""

from .agent_turn import AgentTurnSampler
from .experience import Experience, JointAction, Sample, rollout_stats
from .joint_tree import JointTreeSampler

__all__ = ["AgentTurnSampler", "Experience", "JointAction", "JointTreeSampler", "Sample", "rollout_stats"]
