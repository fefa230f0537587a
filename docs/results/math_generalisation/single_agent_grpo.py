"""ONE agent learns the math team's task with TRL's own GRPOTrainer, on the budget of a team run, and is compared
with the trained team on the same held-out problems, paired by problem (issue 37, item 4).

    python docs/results/math_generalisation/single_agent_grpo.py --team outputs/math_gen_s0 \
        --out docs/results/math_generalisation/single_agent/seed0 --work outputs/single_agent_s0

What is matched to the team run named by ``--team`` (its ``summary.json``): the model, the LoRA settings (r, alpha,
all linear layers, no dropout), the sampling (temperature, top-p, K = ``num_generations`` completions per prompt, at
most ``max_completion_length`` new tokens), the learning rate and its schedule, the seed, and the number of
generated training tokens: training stops at the first step after the single agent's completions reach the team's
``generated_samples.completion_tokens``; the training problems are the team's (its ``dataset_split``, seed and
``num_tasks``). The single agent is the team's reasoner (its first-turn prompt: the system
message, the worked examples as chat turns, the problem) and is rewarded as the reasoner is at its first turn
(AT-GRPO Eq. 3 with B.1's rewards: ``alpha * team + local``, the team's answer being its own). Everything else is
TRL's default (its loss, advantage scaling, beta 0).

Held out: the team run's problems (``make_dataset(split="test")`` with the run's seed; the script checks that the
task ids equal the team's), one greedy answer each, scored by the environment (``final/team_correct``). Written to
``--out``: ``result.json`` (the budget, the steps, the single agent's held-out mean per set, and the team minus the
single agent per set with a paired 95% bootstrap interval over problems), ``per_task.jsonl`` and ``texts.jsonl``;
the trained adapter goes to ``--work``/adapter (TRL's own output directory is ``--work``/trl).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("single_agent_grpo")
METRIC = "final/team_correct"


def read_team(team_dir: Path) -> dict:
    summary = json.loads((team_dir / "summary.json").read_text())
    recipe, config = summary["recipe"], summary["config"]
    budget = (summary.get("generated_samples") or {}).get("completion_tokens")
    if not budget:
        raise SystemExit(f"{team_dir}/summary.json records no generated_samples.completion_tokens: rerun the team")
    per_task = {}
    for line in (team_dir / "eval_per_task.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["stage"] == "after" and row["method"] == "team":
            per_task[row["task_id"]] = row[METRIC]
    if not per_task:
        raise SystemExit(f"{team_dir}/eval_per_task.jsonl has no trained-team rows (stage after, method team)")
    return {"summary": summary, "recipe": recipe, "config": config, "budget": int(budget), "team": per_task}


class TokenBudget:
    """Counts the completion tokens the reward function sees and stops training once they reach ``budget``."""

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


def make_reward(env_cls, env_kwargs: dict, alpha: float, budget: TokenBudget):
    def reasoner_reward(completions, question, answer, completion_ids, **_):
        budget.used += sum(len(ids) for ids in completion_ids)
        rewards = []
        for completion, q, a in zip(completions, question, answer):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            env = env_cls(**env_kwargs)
            env.reset({"question": q, "answer": a})
            step = env.step({"reasoner": text})
            rewards.append(alpha * step.team_reward + step.local_rewards["reasoner"])
        return rewards

    return reasoner_reward


def train(team: dict, work: Path, model_override: str | None, max_steps: int):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from trl_multiagent.environments import ENVIRONMENTS
    from trl_multiagent.models import load_base_model, load_tokenizer, resolve_model

    recipe, config = team["recipe"], team["config"]
    env_cls = ENVIRONMENTS[recipe["environment"]]
    env_kwargs = dict(recipe.get("env_kwargs") or {})
    model_path = resolve_model(model_override or recipe.get("model") or "smollm2-135m-instruct")
    seed = int(config["seed"])
    rows = env_cls.make_dataset(num_tasks=int(recipe.get("num_tasks", 256)), seed=seed,
                                split=recipe.get("dataset_split", "train")).to_list()
    env = env_cls(**env_kwargs)
    data = []
    for row in rows:
        env.reset(row)
        data.append({"prompt": env.first_prompt("reasoner"), "question": row["question"], "answer": row["answer"]})
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
                          reward_funcs=make_reward(env_cls, env_kwargs, float(config.get("alpha", 1.0)), budget),
                          args=args, train_dataset=Dataset.from_list(data), processing_class=load_tokenizer(model_path),
                          peft_config=lora, callbacks=[budget.callback])
    start = time.perf_counter()
    trainer.train()
    trained = {"steps": trainer.state.global_step, "completion_tokens": budget.used, "budget": budget.budget,
               "train_s": time.perf_counter() - start, "model": model_path, "env_kwargs": env_kwargs, "seed": seed}
    if budget.used < budget.budget:
        raise SystemExit(f"training stopped at step {trainer.state.global_step} with {budget.used} of the team's "
                         f"{budget.budget} completion tokens: raise --max_steps")
    trainer.model.save_pretrained(work / "adapter")
    return trainer.model, trained, env_cls


def evaluate(peft_model, trained: dict, team: dict, env_cls, out: Path) -> dict:
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import GenerationConfig

    from trl_multiagent.agents import AgentPool, AgentSpec
    from trl_multiagent.evaluation import TEAM, EpisodeEvaluator, evaluate_team, play_episodes
    from trl_multiagent.evaluation.core import MethodOutput
    from trl_multiagent.evaluation.episodes import by_task, episode_record, episode_texts
    from trl_multiagent.evaluation.report import task_sets_of
    from trl_multiagent.metrics.stats import paired_bootstrap

    recipe = team["recipe"]
    seed, env_kwargs = trained["seed"], trained["env_kwargs"]
    tasks = env_cls.make_dataset(num_tasks=int(recipe.get("eval_num_problems", 120)), seed=seed, split="test").to_list()
    ids = [t["task_id"] for t in tasks]
    if ids != team["summary"]["evaluation"]["task_ids"]:
        raise SystemExit("the held-out problems differ from the team run's: same environment and seed?")
    pool = AgentPool([AgentSpec("reasoner", model=trained["model"], lora_r=int(recipe.get("lora_r", 16)),
                                lora_alpha=int(recipe.get("lora_alpha", 32)), lora_dropout=0.0)], dtype="float32")
    trained_state = get_peft_model_state_dict(peft_model)
    set_peft_model_state_dict(pool.base_of("reasoner"), trained_state, adapter_name="reasoner")
    loaded = get_peft_model_state_dict(pool.base_of("reasoner"), adapter_name="reasoner")
    if set(loaded) != set(trained_state) or any(not torch.equal(loaded[k], trained_state[k]) for k in loaded):
        raise SystemExit("the trained adapter did not load into the evaluation pool")

    class ReasonerAlone(EpisodeEvaluator):
        """One greedy answer of the trained reasoner alone (adapter on), scored by the environment."""

        def program(self, method, tasks, num_samples):
            episodes = yield from play_episodes(self.env_factory, tasks, num_samples, 1, use_adapter=True,
                                                acting=["reasoner"])
            return MethodOutput([[episode_record(ep) for ep in eps] for eps in by_task(episodes, len(tasks))], {},
                                episode_texts(episodes))

    evaluator = ReasonerAlone(lambda: env_cls(**env_kwargs), num_turns=1)
    greedy = GenerationConfig(max_new_tokens=int(recipe.get("eval_max_new_tokens", 40)), do_sample=False)
    single = evaluate_team(pool, evaluator, tasks, (TEAM,), generation_config=greedy, seed=seed).methods[TEAM]
    single_scores = single.per_task(METRIC)
    team_scores = [team["team"][i] for i in ids]
    sets = {"all": list(range(len(ids))), **(task_sets_of(tasks) or {})}
    result = {"command": " ".join(["python", *sys.argv]), "team_run": team["summary"].get("command"),
              "training": trained, "held_out_tasks": len(ids), "metric": METRIC, "sets": {}}
    for name, idx in sets.items():
        s, t = [single_scores[i] for i in idx], [team_scores[i] for i in idx]
        result["sets"][name] = {"tasks": len(idx),
                                "single_agent": paired_bootstrap(s, None, seed=seed),
                                "team": paired_bootstrap(t, None, seed=seed),
                                "team_minus_single": paired_bootstrap(t, s, seed=seed)}
    with (out / "per_task.jsonl").open("w") as f:
        for i, task_id in enumerate(ids):
            f.write(json.dumps({"task_id": task_id, "held_out_set": tasks[i].get("held_out_set"),
                                "single_agent": single_scores[i], "team": team_scores[i]}) + "\n")
    with (out / "texts.jsonl").open("w") as f:
        for row in single.texts:
            f.write(json.dumps(row) + "\n")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--team", required=True, help="output_dir of the team run (summary.json, eval_per_task.jsonl)")
    parser.add_argument("--out", required=True, help="the results (result.json, per_task.jsonl, texts.jsonl)")
    parser.add_argument("--work", default="outputs/single_agent", help="TRL's output directory and the adapter")
    parser.add_argument("--model", default=None, help="default: the team run's model")
    parser.add_argument("--max_steps", type=int, default=400, help="a cap; the token budget stops training")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    team = read_team(Path(args.team))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, trained, env_cls = train(team, Path(args.work), args.model, args.max_steps)
    result = evaluate(model, trained, team, env_cls, out)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in result["sets"].items():
        d = entry["team_minus_single"]
        log.info("%s (%d tasks): single agent %.3f, team %.3f, team - single %+.3f [%+.3f, %+.3f]", name,
                 entry["tasks"], entry["single_agent"]["mean"], entry["team"]["mean"], d["mean"], *d["ci95"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
