"""Task reward of cooperative coding: an auxiliary agent writes ``aux``, the main agent the entry point.

Name it in a recipe as ``env_kwargs: {reward_fn: rewards/coding.py:cooperative_code_reward}``. The environment
(``humaneval_aux_main``) extracts both agents' code, runs the task's unit tests on the joined program in the sandbox
(``trl_multiagent.sandbox.run_tests``) and calls the reward with the pass rate; it reads ``total``, ``levels`` and
``stopped_at`` from what it returns.

The reward is the paper's four levels, checked in order, each gate ending the evaluation (blocks of
``trl_multiagent.reward_blocks.coding``; ``analyze`` gives the static facts, ``WEIGHTS`` the points):

=============  ========================================================================  ====
level          points                                                                    max
=============  ========================================================================  ====
structure      main defines the entry point with a ``return`` (0.5; else stop at 0),     1.0
               aux defines ``aux`` with a ``return`` (0.5)
syntax         task imports + aux + main parse (1.0; else stop)                          1.0
tests          2 x the fraction of unit tests passed (none passed: stop)                 2.0
cooperation    main calls ``aux`` (+0.5) and does more than wrap it (+0.5); main calls   1.0
               ``aux`` only to discard its value (-1.0)
=============  ========================================================================  ====

``level_reward`` applies the levels; the environment uses the same function when no reward is named, so an installed
package scores exactly as this function does.
"""

from __future__ import annotations

from collections.abc import Mapping

from trl_multiagent.reward_blocks.coding import RewardBreakdown, level_reward


def cooperative_code_reward(aux: str, main: str, entry_point: str, pass_rate: float, num_tests: int,
                            imports: str = "", weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """The level-based joint reward of an aux/main pair, at most 5 (MAGRPO Sec. 5.2 "Coding Collaboration" and
    App. C; CoLLM App. F.2).

    ``pass_rate`` is the fraction of the ``num_tests`` unit tests that the joined program passed (0 tests: they could
    not run); ``imports`` are the task's import lines; ``weights`` overrides the points of ``WEIGHTS``.
    """
    return level_reward(aux, main, entry_point, pass_rate, num_tests, imports, weights)
