"""A normal run prints no warnings raised by the project's own calls (issue: every run printed transformers'
FutureWarning about `is_gradient_checkpointing`)."""

import warnings

from datasets import Dataset

from trl_multiagent.agents import AgentSpec
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer


def test_a_short_training_raises_no_warning_from_the_project_or_about_deprecated_names(tiny_ab_model, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", module=r"trl_multiagent(\..*)?")  # raised from the project's own code
        args = MultiAgentGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=1,
                                    num_generations=4, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                                    save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1)
        agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
        trainer = MultiAgentGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))
        trainer.train()
    deprecated = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecated == []
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "trl_multiagent" in w.filename]
    assert ours == []
