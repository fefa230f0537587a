"""TRL's logs (issue 66, item 5): the metric names TRL's GRPOTrainer logs where they mean the same
(``completions/mean_length`` ..., ``rewards/<fn>/mean`` and ``/std``), per agent under ``agent/<name>/``; the
per-turn reward under the evaluation's name (``turn1/team_reward``); each logging step's dict printed as transformers'
ProgressCallback prints it under TRL; and the completions table's task column showing the task, not its solution."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from trl_multiagent.generation.requests import Generation
from trl_multiagent.rollout.experience import JointAction, Sample, rollout_stats


def _sample(agent: str, joint: int, length: int, truncated: bool) -> Sample:
    gen = Generation(prompt_ids=[1], completion_ids=list(range(length)), text="x", truncated=truncated)
    return Sample(agent=agent, policy=agent, episode=0, turn=0, node=0, generation=gen, joint_ids=[joint])


def test_rollout_metrics_carry_trls_names_by_hand():
    samples = [_sample("solver", 0, 4, False), _sample("checker", 0, 10, True), _sample("solver", 1, 6, False),
               _sample("checker", 1, 2, False)]
    joints = [JointAction(0, 0, 0, 0, (0, 1), reward=1.0, done=False,
                          info={"solver/acc": 1.0, "checker/acc": 0.0, "agree": 1.0, "tool_calls": 2.0}),
              JointAction(1, 1, 0, 1, (2, 3), reward=0.5, done=True,
                          info={"solver/acc": 0.0, "checker/acc": 1.0, "agree": 0.0, "tool_calls": 0.0})]
    stats = rollout_stats(["solver", "checker"], samples, joints, 4, 1, reward_names=["acc", "agree"])
    # every value of a reward function, both agents' and both joint actions' (TRL: over all samples)
    assert stats["rewards/acc/mean"] == 0.5
    assert stats["rewards/acc/std"] == pytest.approx(statistics.stdev([1, 0, 0, 1]))
    assert stats["rewards/agree/mean"] == 0.5 and stats["rewards/agree/std"] == pytest.approx(math.sqrt(0.5))
    assert stats["agent/solver/rewards/acc/mean"] == 0.5 and stats["agent/checker/rewards/acc/mean"] == 0.5
    assert stats["agent/solver/rewards/acc/std"] == pytest.approx(math.sqrt(0.5))
    assert stats["env/tool_calls"] == 1.0  # not a reward function: the environment's own name
    assert not [k for k in stats if k.startswith("env/") and ("acc" in k or "agree" in k)]
    # lengths: all samples, then per agent; clipped = hit the limit without an EOS; terminated = the others
    assert (stats["completions/mean_length"], stats["completions/min_length"], stats["completions/max_length"]) == \
        (5.5, 2.0, 10.0)
    assert stats["completions/clipped_ratio"] == 0.25
    assert (stats["completions/mean_terminated_length"], stats["completions/min_terminated_length"],
            stats["completions/max_terminated_length"]) == (4.0, 2.0, 6.0)
    assert stats["agent/checker/completions/mean_length"] == 6.0
    assert stats["agent/checker/completions/clipped_ratio"] == 0.5
    assert stats["agent/solver/completions/max_length"] == 6.0
    # turns counted from 1, as the evaluation's turn<t>/... in report.md
    assert stats["turn1/team_reward"] == 1.0 and stats["turn2/team_reward"] == 0.5
    for old in ("turn/0/reward", "agent/solver/completion_length", "agent/solver/clipped_ratio"):
        assert old not in stats


def test_a_single_value_has_no_std_as_in_trl():
    joints = [JointAction(0, 0, 0, 0, (0,), reward=1.0, done=True, info={"a/acc": 1.0})]
    stats = rollout_stats(["a"], [_sample("a", 0, 3, False)], joints, 1, 1, reward_names=["acc"])
    assert stats["rewards/acc/mean"] == 1.0 and math.isnan(stats["rewards/acc/std"])


def test_min_and_max_lengths_are_taken_over_processes(monkeypatch):
    from trl_multiagent.trainers import sharding

    per_process = [{"completions/min_length": 3.0, "completions/max_length": 9.0, "reward": 1.0},
                   {"completions/min_length": 5.0, "completions/max_length": 7.0, "reward": 0.0}]

    def gather(out, _):
        out[:] = per_process

    monkeypatch.setattr(sharding.dist, "all_gather_object", gather)
    assert sharding.average_stats(per_process[0], 2) == {"completions/min_length": 3.0,
                                                         "completions/max_length": 9.0, "reward": 0.5}


def has_a(completions, **kwargs):
    return [float("A" in c) for c in completions]


def test_a_training_run_logs_trls_names_per_agent(tiny_ab_model, tmp_path):
    from datasets import Dataset

    from trl_multiagent import AgentSpec, FunctionEnvironment, MAGRPOConfig, MAGRPOTrainer

    def env():
        return FunctionEnvironment(["agent1", "agent2"], {"agent1": lambda t: "q", "agent2": lambda t: "q"},
                                   reward_funcs=[has_a])

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=2, num_generations=2,
                                max_steps=1, save_strategy="no", disable_tqdm=True)
    agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    MAGRPOTrainer(agents, env, args, Dataset.from_dict({"task_id": [0, 1]})).train()
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
                 if "reward" in json.loads(line)]
    for key in ("rewards/has_a/mean", "rewards/has_a/std", "agent/agent1/rewards/has_a/mean",
                "agent/agent2/rewards/has_a/std", "completions/mean_length", "completions/clipped_ratio",
                "agent/agent1/completions/mean_length", "agent/agent2/completions/clipped_ratio", "turn1/team_reward"):
        assert key in record, key
    assert not [k for k in record if k.startswith("env/")]  # every info value was a reward function's
    # each joint action's team reward is the sum of both agents' has_a: the means agree
    assert record["reward"] == pytest.approx(2 * record["rewards/has_a/mean"])


# ------------------------------------------------------------------------------------------------ the console
LOGS = {"loss": 0.123456, "grad_norm": 1.5, "reward": 0.25, "learning_rate": 1e-06, "epoch": 0.5,
        "total_flos": 12.0, "note": "y" * 150, "step_time": 3}


def trl_prints(logs) -> str:
    """What transformers' ProgressCallback writes under TRL's GRPOTrainer for ``logs``."""
    from transformers import ProgressCallback, TrainerControl, TrainerState, TrainingArguments

    written = []
    callback = ProgressCallback()
    callback.training_bar = type("Bar", (), {"write": staticmethod(written.append)})()
    callback.on_log(TrainingArguments(output_dir="unused", report_to=[]), TrainerState(), TrainerControl(),
                    logs=dict(logs))
    return written[0]


def test_each_logged_dict_is_printed_as_trl_prints_it(tmp_path, capsys):
    from transformers import TrainerControl, TrainerState

    from trl_multiagent.trainers import MAGRPOConfig
    from trl_multiagent.trainers.callbacks import TrainingProgressCallback, format_logs

    assert format_logs(LOGS) == trl_prints(LOGS)
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[])
    state = TrainerState(max_steps=0)  # no bar to draw: printed plainly
    callback = TrainingProgressCallback()
    callback.on_train_begin(args, state, TrainerControl())
    callback.on_log(args, state, TrainerControl(), logs=dict(LOGS))
    assert capsys.readouterr().out == trl_prints(LOGS) + "\n"
    quiet = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], print_logs=False)
    callback.on_log(quiet, state, TrainerControl(), logs=dict(LOGS))
    assert capsys.readouterr().out == ""


def test_the_dict_is_printed_above_the_progress_bar(tmp_path, capsys):
    from transformers import TrainerControl, TrainerState

    from trl_multiagent.trainers import MAGRPOConfig
    from trl_multiagent.trainers.callbacks import TrainingProgressCallback

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[])
    state = TrainerState(max_steps=3)
    callback = TrainingProgressCallback()
    callback.on_train_begin(args, state, TrainerControl())
    assert callback.progress is not None
    callback.on_log(args, state, TrainerControl(), logs={"reward": 0.5, "loss": 0.1})
    callback.on_train_end(args, state, TrainerControl())
    assert trl_prints({"reward": 0.5, "loss": 0.1}) in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ completions table
def test_the_task_column_shows_the_question_not_the_solution():
    from trl_multiagent.trainers.completions import describe_task

    chat = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}],
            "solution": "$5$"}
    assert describe_task(chat) == "What is 2 + 3?"
    assert describe_task({"solution": "$5$", "question": "What is 2 + 3?"}) == "What is 2 + 3?"
    assert describe_task({"answer": "5", "body": "2 + 3"}) == "2 + 3"
    assert describe_task({"task_id": "q7", "prompt": "x"}) == "q7"
