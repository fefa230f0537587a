"""Rollout engines ("samplers"): how a team explores an environment and what experience it keeps.

A sampler turns a batch of tasks into :class:`Experience`: one :class:`Sample` per (agent, turn, sampled response)
with its token ids, the group it is compared within, the rewards the environment gave and the links of the tree.
Returns and advantages are not the sampler's: the trainer's ``assign_credit`` computes them from the pure functions
of :mod:`trl_multiagent.credit` right after the rollout. One module per rollout topology:

| module | sampler | paper |
|---|---|---|
| ``joint_tree`` | :class:`JointTreeSampler` | MAGRPO: tree of joint actions, joint groups per node |
| ``agent_turn`` | :class:`AgentTurnSampler` | AT-GRPO: (instance, turn, agent) groups, greedy tree sampling |
| ``debate`` | :class:`DebateSampler` | MAPoRL: n-agent debates, verifier rewards, incentives, penalties |
| ``single_path`` | :class:`SinglePathSampler` | CoLLM-CC/DC: one path per episode, joint transitions for the critic |
| ``pipeline`` | :class:`PipelineSampler` | MHGPO: a DAG of agents and tools, IS / FoF / RR group rollouts |

May import: :mod:`trl_multiagent.team`, :mod:`trl_multiagent.environments`, :mod:`trl_multiagent.credit`,
:mod:`trl_multiagent.metrics`, :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.errors`.
"""

from trl_multiagent.rollout.agent_turn import AgentTurnSampler, CandidateSample
from trl_multiagent.rollout.debate import DebateSample, DebateSampler
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, credit_stats, rollout_stats
from trl_multiagent.rollout.joint_tree import JointTreeSampler
from trl_multiagent.rollout.pipeline import PipelineExperience, PipelineSample, PipelineSampler
from trl_multiagent.rollout.single_path import EpisodeBuffer, SinglePathSampler, Transition

__all__ = ["AgentTurnSampler", "CandidateSample", "DebateSample", "DebateSampler", "EpisodeBuffer", "Experience",
           "JointAction", "JointTreeSampler", "PipelineExperience", "PipelineSample", "PipelineSampler", "Sample",
           "SinglePathSampler", "Transition", "credit_stats", "rollout_stats"]
