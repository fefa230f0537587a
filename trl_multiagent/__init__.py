"""trl-multiagent: multi-agent reinforcement learning for cooperating LLM agents on top of TRL."""

__version__ = "0.1.0"
