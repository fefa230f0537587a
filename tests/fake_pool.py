"""A stand-in for AgentPool that answers from a script, to test rollout logic without a model: the package's own
test helper (:mod:`trl_multiagent.testing`), re-exported under the name the tests have always used."""

from trl_multiagent.testing import ScriptedPool

__all__ = ["ScriptedPool"]
