"""A saved team, loaded for use: ``Team.from_pretrained(output_dir)`` and ``team.play(task)``.

A run saves its team under ``<output_dir>/adapters/`` (each policy's LoRA adapter and ``team.json``, the team's
layout; every ``checkpoint-N`` folder has the same) and the recipe it ran in ``<output_dir>/summary.json``. A
:class:`Team` puts the three things back together that playing needs: the agents (the pool of bases and trained
adapters, :meth:`AgentPool.from_pretrained <trl_multiagent.team.pool.AgentPool.from_pretrained>`), the recipe's
environment (``environment``, ``env_kwargs``) and its decoding settings of the held-out evaluation
(``eval_max_new_tokens``, greedy unless the recipe samples, ``generation_kwargs``, the turn budget ``num_turns``).
So a question asked from Python is answered as the held-out problems were, without copying settings by hand::

    from trl_multiagent import Team

    team = Team.from_pretrained("outputs/demo")
    play = team.play({"question": "Ann has 3 boxes of 12 pens. How many pens does she have?"})
    play.answer        # the team's final answer, e.g. '36'
    play.turns[0]      # turn 1: {agent: its messages (the prompt, then its response)}

The task needs no gold answer: the math team (:mod:`~trl_multiagent.environments.math_tool`) plays a question without
``answer`` and its steps then carry no rewards (``play.rewards`` holds ``None``). :func:`read_saved_recipe` and
:func:`eval_generation_config` serve the ``evaluate`` command (:mod:`trl_multiagent.command.evaluate`) as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_multiagent.errors import RecipeError

SUMMARY_FILE = "summary.json"
TEAM_FILE = "adapters/team.json"


def find_saved_team(directory: str | Path) -> tuple[Path, Path | None]:
    """``(the folder that holds adapters/team.json, the summary.json of its run or None)``: ``directory`` is the
    output_dir of a run or one of its ``checkpoint-N`` folders (whose run's summary is one folder up)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise RecipeError(f"{str(folder)!r} does not exist (or is not a directory): give the output_dir of a "
                          "finished run (it holds adapters/ and summary.json) or one of its checkpoint-N folders")
    if not (folder / TEAM_FILE).is_file():
        checkpoints = sorted(p.name for p in folder.glob("checkpoint-*") if (p / TEAM_FILE).is_file())
        hint = f"; its checkpoints {checkpoints} do" if checkpoints else ""
        raise RecipeError(f"{str(folder)!r} holds no saved team (no {TEAM_FILE}: a run writes it when training ends, "
                          f"and every checkpoint-N has one){hint}")
    for candidate in (folder / SUMMARY_FILE, folder.parent / SUMMARY_FILE):
        if candidate.is_file():
            return folder, candidate
    return folder, None


def read_saved_recipe(directory: str | Path, config: str | Path | None = None, overrides: Sequence[str] = (),
                      prog: str = "trl_multiagent"):
    """The recipe of a saved team as ``(RecipeArguments, trainer config, the given values, the team's folder)``.

    By default the recipe its run recorded (``summary.json``'s ``recipe``: the values of the recipe file and the
    command line, as given); ``config`` names a recipe file instead. ``overrides`` are ``--field value`` pairs on top
    (``["--eval_max_new_tokens", "64"]``), checked like the train command's. ``report_to`` is ``none`` unless they
    say otherwise, and a recorded ``resume_from_checkpoint`` or ``init_adapters`` is dropped: nothing trains here."""
    from trl_multiagent.command.recipe_parser import parse_recipe

    folder, summary_path = find_saved_team(directory)
    argv = ["--report_to", "none", *overrides]  # playing and evaluating log to no tracker (an override may say one)
    if config is not None:
        return (*parse_recipe(["--config", str(config), *argv], prog=prog), folder)
    recorded = None
    if summary_path is not None:
        try:
            recorded = json.loads(summary_path.read_text()).get("recipe")
        except (OSError, ValueError) as exc:
            raise RecipeError(f"{summary_path} does not parse ({type(exc).__name__}); pass the recipe with "
                              "--config") from exc
    if not isinstance(recorded, dict) or not recorded:
        where = str(summary_path) if summary_path is not None else f"{SUMMARY_FILE} (there is none)"
        raise RecipeError(f"{where} records no recipe (a team trained from Python, or a run that did not finish): "
                          "pass the recipe it was trained with (--config recipe.yaml, or config= from Python)")
    recorded = {k: v for k, v in recorded.items() if k not in ("resume_from_checkpoint", "init_adapters")}
    return (*parse_recipe(argv, yaml_text=json.dumps(recorded), prog=prog), folder)


def eval_generation_config(recipe, config, sampled: bool):
    """The held-out evaluation's decoding: ``(GenerationConfig, its settings)`` from ``eval_max_new_tokens``, greedy
    or sampled (at ``eval_temperature``, else the training temperature, and ``top_p``), over ``generation_kwargs``."""
    from transformers import GenerationConfig

    settings: dict[str, Any] = {"max_new_tokens": recipe.eval_max_new_tokens, "do_sample": sampled}
    if sampled:
        temperature = recipe.eval_temperature if recipe.eval_temperature is not None else config.temperature
        settings.update(temperature=temperature, top_p=config.top_p if config.top_p is not None else 1.0)
    return GenerationConfig(**{**(config.generation_kwargs or {}), **settings}), settings


def evaluation_samples(recipe, probe) -> bool:
    """Whether the recipe's held-out evaluation samples (``eval_temperature`` > 0, or, when it is empty, an evaluator
    or trainer that evaluates by sampling: coding, debates, ``maporl``) rather than decoding greedily."""
    from trl_multiagent.command.recipe import _trainer_registry
    from trl_multiagent.evaluation import EVALUATORS, evaluator_kind

    if recipe.eval_temperature is not None:
        return recipe.eval_temperature > 0
    trainer_cls = _trainer_registry()[recipe.trainer][1]
    kind = recipe.evaluator
    if kind == "auto":
        kind = trainer_cls.default_evaluator or evaluator_kind(probe)
    return bool(getattr(EVALUATORS.get(kind), "sampled", False) or trainer_cls.evaluate_sampled)


def load_pool(folder: str | Path, config):
    """The saved team's :class:`~trl_multiagent.team.pool.AgentPool` (bases and trained adapters), with the config's
    settings of how the bases compute (``model_dtype``, ``packed_weights``, ``lean_decode``, ...)."""
    from trl_multiagent.team.pool import AgentPool

    options = {k: getattr(config, k) for k in ("dense_copy", "packed_weights", "lean_decode", "frozen_matmul_dtype")
               if hasattr(config, k)}
    return AgentPool.from_pretrained(folder, dtype=getattr(config, "model_dtype", "auto"), **options)


def check_team_fits(folder: Path, roles: Sequence[str]) -> None:
    """The saved team's agents are the environment's roles (before any model loads)."""
    names = [a.get("name") for a in json.loads((folder / TEAM_FILE).read_text()).get("agents", [])]
    if sorted(names) != sorted(roles):
        raise RecipeError(f"the team saved in {str(folder)!r} has the agents {names}, the recipe's environment the "
                          f"roles {list(roles)}; give the recipe the team was trained with")


@dataclass
class Play:
    """One task played by a team.

    Attributes:
        turns: per turn, each acting agent's messages: its prompt as chat messages, then its response
            (``{"role": "assistant", "content": ...}``; an agent with tools: the whole exchange).
        answer: the team's final answer: the environment's ``team_answer()`` where it has one (the math team:
            the agreed answer, else the answer of its ``final_answer`` agent), else the last response.
        rewards: the team reward of every step (``None`` where the task has nothing to score against).
        info: the last step's ``info`` (e.g. ``agreed``).
    """

    turns: list[dict[str, list[dict[str, Any]]]]
    answer: str | None
    rewards: list[float | None] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def responses(self) -> list[dict[str, str]]:
        """Per turn, each acting agent's response text."""
        return [{agent: messages[-1]["content"] for agent, messages in turn.items()} for turn in self.turns]


def _messages(prompt) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


class Team:
    """A team ready to play tasks: its agents (an :class:`~trl_multiagent.team.pool.AgentPool`), its environment and
    its decoding settings. :meth:`from_pretrained` loads a saved one (see the module docstring).

    Args:
        pool: the agents.
        env_factory: a zero-argument factory of the environment.
        num_turns: the turn budget of an episode (the environment may end it sooner).
        generation_config: a ``transformers.GenerationConfig`` (greedy, 128 new tokens when ``None``).
        agent_order: ``"parallel"`` (all agents answer the same state) or ``"sequential"`` (one after another
            within a turn, on an environment that accepts partial actions).
    """

    def __init__(self, pool, env_factory: Callable[[], Any], num_turns: int = 1, generation_config=None,
                 agent_order: str = "parallel", recipe=None, config=None):
        from transformers import GenerationConfig

        if agent_order not in ("parallel", "sequential"):
            raise ValueError(f"agent_order must be 'parallel' or 'sequential', got {agent_order!r}")
        self.pool, self.env_factory, self.num_turns, self.agent_order = pool, env_factory, num_turns, agent_order
        self.generation_config = generation_config or GenerationConfig(max_new_tokens=128, do_sample=False)
        self.recipe, self.config = recipe, config

    @classmethod
    def from_pretrained(cls, directory: str | Path, config: str | Path | None = None, **overrides: Any) -> Team:
        """Load the team saved in ``directory`` (a run's output_dir or one of its ``checkpoint-N`` folders) with the
        recipe its run recorded, or the recipe file ``config``; ``overrides`` set recipe fields
        (``eval_max_new_tokens=64``, ``eval_temperature=0.7``, ``env_kwargs={...}``)."""
        from trl_multiagent.command.recipe import environment_factory

        argv = [item for key, value in overrides.items()
                for item in (f"--{key}", value if isinstance(value, str) else json.dumps(value))]
        recipe, conf, _, folder = read_saved_recipe(directory, config, argv)
        _, factory, probe = environment_factory(recipe)
        check_team_fits(folder, probe.agents)
        generation, _ = eval_generation_config(recipe, conf, evaluation_samples(recipe, probe))
        order = conf.evaluation_agent_order if hasattr(conf, "evaluation_agent_order") else "parallel"
        sequential = order == "sequential" and getattr(probe, "supports_partial_actions", False)
        return cls(load_pool(folder, conf), factory, conf.num_turns, generation,
                   "sequential" if sequential else "parallel", recipe, conf)

    @property
    def agents(self) -> list[str]:
        return list(self.pool.agent_names)

    def play(self, task: Mapping[str, Any]) -> Play:
        """Play one episode of ``task`` (a mapping of the environment's columns; the gold answer may be absent) with
        the trained adapters and return every agent's messages per turn and the team's final answer."""
        from trl_multiagent.environments.stepping import reset_env
        from trl_multiagent.errors import UserCodeError, user_code_error
        from trl_multiagent.evaluation.core import inference_mode
        from trl_multiagent.team.pool import GenerationRequest

        env = self.env_factory()
        prompts = dict(reset_env(env, task))
        agents = list(env.agents)
        stages = [[a] for a in agents] if self.agent_order == "sequential" else [agents]
        turns: list[dict[str, list[dict[str, Any]]]] = []
        rewards: list[float | None] = []
        info: dict[str, Any] = {}
        last: str | None = None
        done = False
        with inference_mode(self.pool):
            for turn in range(self.num_turns):
                turns.append({})
                for stage in stages:
                    generations = self.pool.generate_many([GenerationRequest(a, prompts[a]) for a in stage],
                                                          self.generation_config)
                    action = {}
                    for agent, (gen, *_) in zip(stage, generations):
                        action[agent] = last = gen.text
                        turns[-1][agent] = _messages(prompts[agent]) + \
                            (list(gen.messages) if gen.messages else [{"role": "assistant", "content": gen.text}])
                    try:  # rewards may be None here (nothing to score), so not step_env's finite-reward check
                        result = env.step(action)
                    except UserCodeError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - user code may raise anything; reported with context
                        raise user_code_error(exc, f"{type(env).__name__}.step", task=task, turn=turn,
                                              joint_action=action) from exc
                    rewards.append(result.team_reward)
                    info = dict(result.info)
                    done = result.done
                    if done:
                        break
                    prompts = dict(result.next_prompts)
                if done:
                    break
        answer = env.team_answer() if callable(getattr(env, "team_answer", None)) else last
        return Play(turns, answer, rewards, info)
