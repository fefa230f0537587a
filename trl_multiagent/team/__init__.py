"""The team: each agent's spec (:mod:`.agent_spec`: name, base, policy, tools, critic), the pool that loads each base
once and holds one LoRA adapter per policy and generates through the engine (:mod:`.pool`), value-head critics
(:mod:`.critics`) and the adapter files (:mod:`.adapter_files`: saved finite and whole, loaded back).

May import: :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.models`, :mod:`trl_multiagent.environments`
(an agent's tools), :mod:`trl_multiagent.runtime`, :mod:`trl_multiagent.errors`.
"""
