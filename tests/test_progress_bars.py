"""The training progress bar: steps done, and the last logged reward and step time in its status."""

from transformers import TrainerControl, TrainerState, TrainingArguments

from trl_multiagent.trainers.callbacks import TrainingProgressCallback


def test_training_bar_counts_steps_and_shows_the_last_reward(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state, control = TrainerState(max_steps=5, global_step=0), TrainerControl()
    bar = TrainingProgressCallback()
    bar.on_train_begin(args, state, control)
    task = bar.progress.tasks[0]
    assert task.total == 5 and task.completed == 0
    state.global_step = 2
    bar.on_step_end(args, state, control)
    bar.on_log(args, state, control, logs={"reward": 0.4567, "loss": -0.25, "step_time": 12.3, "epoch": 0.1})
    assert task.completed == 2
    assert task.fields["status"] == "reward 0.457 · loss -0.250 · 12 s/step"
    bar.on_log(args, state, control, logs={"train_runtime": 3.0})  # a log without them keeps the last status
    assert task.fields["status"].startswith("reward 0.457")
    state.global_step = 5
    bar.on_train_end(args, state, control)
    assert task.completed == 5 and bar.progress is None


def test_no_bar_on_other_processes(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state = TrainerState(max_steps=5, is_world_process_zero=False)
    bar = TrainingProgressCallback()
    bar.on_train_begin(args, state, TrainerControl())
    assert bar.progress is None
    bar.on_log(args, state, TrainerControl(), logs={"reward": 1.0})  # nothing to update, no error
