"""One agent of a team trained ALONE with TRL's own ``GRPOTrainer``, on the budget of a team run, and evaluated on the
team run's held-out tasks, paired with the team by task (issue 60, item 2; AT-GRPO Table 1's "single agent + GRPO").

    python -m trl_multiagent train-single --team outputs/demo --agent tool --out outputs/demo-single/tool

A team claim is only as good as its strongest single-agent rival, so the comparison runs for every role of the team
(``--agent`` may be given several times; default: every agent that can act alone) and ``result.json`` names the best
trained single agent on the held-out tasks.

What is matched to the team run named by ``--team`` (its ``summary.json``): the model, the LoRA settings (r, alpha,
all linear layers, no dropout), the sampling (temperature, top-p, K = ``num_generations`` completions per prompt, at
most ``max_completion_length`` new tokens), the learning rate and its schedule, the seed, the training tasks (the
recipe's generated ``dataset_split``, seed and ``num_tasks``) and the number of generated training tokens: training
stops at the first step after the single agent's completions reach the team's ``generated_samples.completion_tokens``.
The agent sees its own first-turn prompt of the team's episode (``reset``) and is rewarded as at its first turn in
the team, acting alone (AT-GRPO Eq. 3: ``alpha * team + local``; with the other agent silent the team's answer is its
own). Everything else is TRL's default (its loss and advantage scaling, ``beta`` 0).

Held out: the team run's tasks (the environment's generated test split with the run's seed; the task ids are checked
against the team's), one greedy answer each, scored by the environment on the team run's headline metric. Written
to ``--out``: ``result.json`` (per agent: the budget, the steps, the held-out mean per set, and the team minus the
single agent per set with a paired 95% bootstrap interval over tasks; the best single agent), ``per_task.jsonl`` and
``texts.jsonl``; each trained adapter goes to ``--work/<agent>/adapter`` (TRL's own output directory is
``--work/<agent>/trl``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
#: The metric when the team run names none.
DEFAULT_METRIC = "final/team_correct"


class SingleAgentError(ValueError):
    """A team run or an agent that the single-agent comparison cannot use (one line, exit code 2)."""


def read_team(team_dir: Path) -> dict[str, Any]:
    """The team run's recipe, config, token budget, headline metric and trained-team score per held-out task."""
    summary_path = team_dir / "summary.json"
    if not summary_path.is_file():
        raise SingleAgentError(f"{summary_path} does not exist: --team names the output_dir of a finished team run")
    summary = json.loads(summary_path.read_text())
    recipe, config = summary.get("recipe", {}), summary.get("config", {})
    budget = (summary.get("generated_samples") or {}).get("completion_tokens")
    if not budget:
        raise SingleAgentError(f"{summary_path} records no generated_samples.completion_tokens: rerun the team")
    metric = (summary.get("evaluation") or {}).get("metric") or recipe.get("eval_metric") or DEFAULT_METRIC
    per_task: dict[str, float] = {}
    per_task_path = team_dir / "eval_per_task.jsonl"
    for line in (per_task_path.read_text().splitlines() if per_task_path.is_file() else []):
        row = json.loads(line)
        if row["stage"] == "after" and row["method"] == "team":
            per_task[row["task_id"]] = row[metric]
    if not per_task:
        raise SingleAgentError(f"{per_task_path} has no trained-team rows (stage after, method team)")
    return {"summary": summary, "recipe": recipe, "config": config, "budget": int(budget), "team": per_task,
            "metric": metric}


class TokenBudget:
    """Counts the completion tokens the reward function sees; its callback stops training once they reach
    ``budget`` (the team's generated tokens)."""

    def __init__(self, budget: int):
        from transformers import TrainerCallback

        self.budget, self.used = budget, 0
        outer = self

        class Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if outer.used >= outer.budget:
                    control.should_training_stop = True
                return control

        self.callback = Stop()


def make_reward(env_factory, agent: str, alpha: float, budget: TokenBudget):
    """A TRL reward function: ``alpha * team + local`` of ``agent`` acting alone at the first turn of the team's
    episode (AT-GRPO Eq. 3), every other column of the row passed to ``reset`` as the task."""

    def reward(prompts, completions, completion_ids, **columns):
        budget.used += sum(len(ids) for ids in completion_ids)
        rewards = []
        keys = [k for k in columns if isinstance(columns[k], list) and len(columns[k]) == len(completions)]
        for i, completion in enumerate(completions):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            env = env_factory()
            env.reset({k: columns[k][i] for k in keys})
            step = env.step({agent: text})
            rewards.append(alpha * step.team_reward + (step.local_rewards or {}).get(agent, 0.0))
        return rewards

    reward.__name__ = f"{agent}_alone_reward"
    return reward


def _environment(team: dict):
    import functools

    from trl_multiagent.command.recipe import resolve_environment

    recipe = team["recipe"]
    env_cls = resolve_environment(recipe.get("environment", ""))
    if recipe.get("dataset", "generated") != "generated" or not hasattr(env_cls, "make_dataset"):
        raise SingleAgentError("the single-agent comparison needs a team run on generated tasks (dataset: generated, "
                               f"an environment with make_dataset); {env_cls.__name__} / {recipe.get('dataset')!r}")
    return env_cls, functools.partial(env_cls, **dict(recipe.get("env_kwargs") or {}))


def train_alone(team: dict, agent: str, work: Path, model_override: str | None, max_steps: int):
    """``agent`` trained alone with TRL's ``GRPOTrainer`` on the team's tasks and token budget (module docstring)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from trl_multiagent.models.loading import load_base_model, load_tokenizer, resolve_model

    recipe, config = team["recipe"], team["config"]
    env_cls, env_factory = _environment(team)
    model_path = resolve_model(model_override or recipe.get("model") or "smollm2-135m-instruct")
    seed = int(config["seed"])
    rows = env_cls.make_dataset(num_tasks=int(recipe.get("num_tasks", 256)), seed=seed,
                                split=recipe.get("dataset_split", "train")).to_list()
    env = env_factory()
    data = [{**row, "prompt": env.reset(row)[agent]} for row in rows]
    budget = TokenBudget(team["budget"])
    K = int(config["num_generations"])
    args = GRPOConfig(
        output_dir=str(work / "trl"), num_generations=K, per_device_train_batch_size=4 * K,
        gradient_accumulation_steps=1, max_completion_length=int(config["max_completion_length"]),
        temperature=float(config["temperature"]), top_p=float(config.get("top_p") or 1.0),
        learning_rate=float(config["learning_rate"]), lr_scheduler_type=config.get("lr_scheduler_type", "constant"),
        beta=0.0, max_steps=max_steps, seed=seed, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=False)
    lora = LoraConfig(task_type="CAUSAL_LM", r=int(recipe.get("lora_r", 16)), lora_alpha=int(recipe.get("lora_alpha", 32)),
                      lora_dropout=0.0, target_modules="all-linear", bias="none")
    trainer = GRPOTrainer(model=load_base_model(model_path, dtype="float32"),
                          reward_funcs=make_reward(env_factory, agent, float(config.get("alpha", 1.0)), budget),
                          args=args, train_dataset=Dataset.from_list(data), processing_class=load_tokenizer(model_path),
                          peft_config=lora, callbacks=[budget.callback])
    start = time.perf_counter()
    trainer.train()
    trained = {"agent": agent, "steps": trainer.state.global_step, "completion_tokens": budget.used,
               "budget": budget.budget, "train_s": time.perf_counter() - start, "model": model_path, "seed": seed}
    if budget.used < budget.budget:
        raise SingleAgentError(f"training stopped at step {trainer.state.global_step} with {budget.used} of the "
                               f"team's {budget.budget} completion tokens: raise --max_steps")
    trainer.model.save_pretrained(work / "adapter")
    return trainer.model, trained


def evaluate_alone(peft_model, trained: dict, team: dict) -> tuple[list[float], list[dict], list[dict]]:
    """One greedy answer of the trained ``agent`` alone (adapter on) per held-out task of the team run, scored by the
    environment: ``(scores in the team's task order, the tasks, the texts)``."""
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import GenerationConfig

    from trl_multiagent.evaluation.core import TEAM, MethodOutput, evaluate_team
    from trl_multiagent.evaluation.episodes import (
        EpisodeEvaluator,
        by_task,
        episode_record,
        episode_texts,
        play_episodes,
    )
    from trl_multiagent.team.pool import AgentPool, AgentSpec

    recipe, agent = team["recipe"], trained["agent"]
    env_cls, env_factory = _environment(team)
    tasks = env_cls.make_dataset(num_tasks=int(recipe.get("eval_num_problems") or 120), seed=trained["seed"],
                                 split="test").to_list()
    ids = [t.get("task_id") for t in tasks]
    if ids != team["summary"]["evaluation"]["task_ids"]:
        raise SingleAgentError("the held-out tasks differ from the team run's: same environment and seed?")
    pool = AgentPool([AgentSpec(agent, model=trained["model"], lora_r=int(recipe.get("lora_r", 16)),
                                lora_alpha=int(recipe.get("lora_alpha", 32)), lora_dropout=0.0)], dtype="float32")
    state = get_peft_model_state_dict(peft_model)
    set_peft_model_state_dict(pool.base_of(agent), state, adapter_name=agent)
    loaded = get_peft_model_state_dict(pool.base_of(agent), adapter_name=agent)
    if set(loaded) != set(state) or any(not torch.equal(loaded[k], state[k]) for k in loaded):
        raise SingleAgentError("the trained adapter did not load into the evaluation pool")

    class Alone(EpisodeEvaluator):
        """One greedy answer of the trained agent alone (adapter on), scored by the environment."""

        def program(self, method, tasks, num_samples):
            episodes = yield from play_episodes(self.env_factory, tasks, num_samples, 1, use_adapter=True,
                                                acting=[agent])
            return MethodOutput([[episode_record(ep) for ep in eps] for eps in by_task(episodes, len(tasks))], {},
                                episode_texts(episodes))

    greedy = GenerationConfig(max_new_tokens=int(recipe.get("eval_max_new_tokens") or 40), do_sample=False)
    result = evaluate_team(pool, Alone(env_factory, num_turns=1), tasks, (TEAM,), generation_config=greedy,
                           seed=trained["seed"]).methods[TEAM]
    return result.per_task(team["metric"]), tasks, list(result.texts)


def compare(team: dict, agents_scores: dict[str, list[float]], tasks: list[dict], seed: int) -> dict:
    """Per agent and held-out set: the single agent's mean, the team's, and the team minus the single agent, paired
    by task with a 95% bootstrap interval; and the best single agent over all held-out tasks."""
    from trl_multiagent.evaluation.report import task_sets_of
    from trl_multiagent.metrics.stats import paired_bootstrap

    ids = [t.get("task_id") for t in tasks]
    team_scores = [team["team"][i] for i in ids]
    sets = {"all": list(range(len(ids))), **(task_sets_of(tasks) or {})}
    out: dict[str, Any] = {}
    for agent, scores in agents_scores.items():
        out[agent] = {}
        for name, idx in sets.items():
            s, t = [scores[i] for i in idx], [team_scores[i] for i in idx]
            out[agent][name] = {"tasks": len(idx), "single_agent": paired_bootstrap(s, None, seed=seed),
                                "team": paired_bootstrap(t, None, seed=seed),
                                "team_minus_single": paired_bootstrap(t, s, seed=seed)}
    best = max(out, key=lambda a: out[a]["all"]["single_agent"]["mean"]) if out else None
    return {"sets": out, "best_single_agent": best}


def run(team_dir: Path, agents: list[str] | None, out: Path, work: Path, model: str | None, max_steps: int) -> dict:
    team = read_team(team_dir)
    _, env_factory = _environment(team)
    probe = env_factory()
    roles = list(probe.agents)
    agents = agents or roles
    unknown = [a for a in agents if a not in roles]
    if unknown:
        raise SingleAgentError(f"--agent {unknown[0]!r}: the team's agents are {roles}")
    if len(roles) > 1 and not getattr(probe, "supports_partial_actions", False):
        raise SingleAgentError(f"{type(probe).__name__} takes no action of one agent alone (supports_partial_actions)")
    out.mkdir(parents=True, exist_ok=True)
    scores, training, texts, tasks = {}, {}, [], []
    for agent in agents:
        logger.info("Training %s alone with TRL's GRPOTrainer on the team's budget of %d completion tokens", agent,
                    team["budget"])
        peft_model, trained = train_alone(team, agent, work / agent, model, max_steps)
        scores[agent], tasks, agent_texts = evaluate_alone(peft_model, trained, team)
        training[agent] = trained
        texts += agent_texts
    result = {"command": " ".join(["python -m trl_multiagent train-single", *sys.argv[2:]]),
              "team_run": team["summary"].get("command"), "metric": team["metric"], "held_out_tasks": len(tasks),
              "training": training, **compare(team, scores, tasks, int(team["config"]["seed"]))}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    with (out / "per_task.jsonl").open("w") as f:
        for i, task in enumerate(tasks):
            f.write(json.dumps({"task_id": task.get("task_id"), "held_out_set": task.get("held_out_set"),
                                "team": team["team"][task.get("task_id")],
                                **{f"{a}_alone_grpo": s[i] for a, s in scores.items()}}) + "\n")
    with (out / "texts.jsonl").open("w") as f:
        for row in texts:
            f.write(json.dumps(row) + "\n")
    return result


def main(argv=None, prog: str = "trl_multiagent train-single") -> int:
    from trl_multiagent.errors import fail_command

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--team", required=True, help="output_dir of the team run (summary.json, eval_per_task.jsonl)")
    parser.add_argument("--agent", action="append", default=None,
                        help="a role to train alone (several --agent for several); default: every role")
    parser.add_argument("--out", required=True, help="the results (result.json, per_task.jsonl, texts.jsonl)")
    parser.add_argument("--work", default="outputs/single_agent", help="TRL's output directories and the adapters")
    parser.add_argument("--model", default=None, help="default: the team run's model")
    parser.add_argument("--max_steps", type=int, default=400, help="a cap; the token budget stops training")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        result = run(Path(args.team), args.agent, Path(args.out), Path(args.work), args.model, args.max_steps)
    except SingleAgentError as exc:
        return fail_command(prog, exc)
    for agent, sets in result["sets"].items():
        for name, entry in sets.items():
            d = entry["team_minus_single"]
            logger.info("%s alone, %s (%d tasks): single agent %.3f, team %.3f, team - single %+.3f [%+.3f, %+.3f]",
                        agent, name, entry["tasks"], entry["single_agent"]["mean"], entry["team"]["mean"], d["mean"],
                        *d["ci95"])
    logger.info("best trained single agent on the held-out tasks: %s", result["best_single_agent"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
