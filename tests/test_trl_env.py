"""TRL environments as teams (trl_multiagent/environments/trl_env.py): a TRL environment_factory class, unchanged
(examples/trl_environments/counter_env.py), played by two agents: tools by agent, turns, observations, team reward;
and docs/guides/trl_environments.md's recipe trained for a step on a tiny model."""

from __future__ import annotations

import json
import string

import pytest
from transformers import GenerationConfig

from tests.tiny import save_tiny
from trl_multiagent.command.cli import parse_recipe
from trl_multiagent.command.runner import Run
from trl_multiagent.environments import TRLEnvironmentTeam
from trl_multiagent.generation.requests import ToolPrompt
from trl_multiagent.rollout import JointTreeSampler
from trl_multiagent.testing import ScriptedPool

COUNTER = "examples/trl_environments/counter_env.py:CounterEnv"
RECIPE = "recipes/configs/trl_counter_team.yaml"


def call(name, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def team(**kw):
    return TRLEnvironmentTeam(COUNTER, agents=["adder", "subtractor"],
                              tools={"adder": ["increment"], "subtractor": ["decrement"]}, **kw)


def test_each_agent_gets_its_tools_and_the_prompt_carries_their_schemas():
    env = team()
    prompts = env.reset({"prompt": "Reach the target.", "target": 4})
    assert isinstance(prompts["adder"], ToolPrompt)
    assert [t["function"]["name"] for t in prompts["adder"].tools] == ["increment"]
    assert [t["function"]["name"] for t in prompts["subtractor"].tools] == ["decrement"]
    # reset's text is appended to the prompt, as TRL does
    assert prompts["adder"] == [{"role": "user", "content": "Reach the target. The counter shows 0; the target is 4."}]
    result = env.step({"adder": call("increment", amount=5), "subtractor": call("increment", amount=1)})
    assert not result.done and env.instance.value == 5  # the subtractor may not increment
    assert result.info == {"tool_calls": 2.0, "tool_failures": 1.0}
    own = result.next_prompts["subtractor"]
    assert own[1]["role"] == "user" and "[adder] calls increment" in own[1]["content"]
    assert own[-1]["role"] == "tool" and "not found (tools: decrement)" in own[-1]["content"]
    result = env.step({"adder": "done", "subtractor": call("decrement", amount=1)})
    assert not result.done and env.instance.value == 4
    result = env.step({"adder": "done", "subtractor": "done"})  # nobody calls a tool: the episode ends
    assert result.done and result.team_reward == 1.0 and result.info["CounterEnv"] == 1.0


def test_own_observations_and_bad_calls():
    env = team(observe="own", max_tool_calls_per_turn=1)
    env.reset({"prompt": "Go.", "target": 2})
    result = env.step({"adder": call("increment", amount=9) + call("increment", amount=1),
                       "subtractor": "<tool_call>{oops</tool_call>"})
    assert env.instance.value == 0 and result.info["tool_failures"] == 3.0
    adder = result.next_prompts["adder"]
    assert [m["role"] for m in adder] == ["user", "assistant", "tool", "tool"]  # nothing of the subtractor's
    assert "amount must be from 1 to 5" in adder[2]["content"] and "not run" in adder[3]["content"]


def test_reward_functions_join_get_reward_and_max_turns_ends_the_episode():
    seen = {}

    def moves(prompts, completions, environments, target, **kwargs):
        seen.update(prompts=prompts, completions=completions, target=target)
        return [float(environments[0].moves)]

    env = team(reward_fns=[moves], reward_weights=[0.5], env_reward_weight=2.0, max_turns=1,
               reward_scope="transcript")
    env.reset({"prompt": "Go.", "target": 3})
    result = env.step({"adder": call("increment", amount=3), "subtractor": "fine"})
    assert result.done and result.info["moves"] == 1.0 and result.info["CounterEnv"] == 1.0
    assert result.team_reward == 2.0 * 1.0 + 0.5 * 1.0
    assert seen["target"] == [3] and seen["completions"][0][0]["name"] == "adder"
    with pytest.raises(ValueError, match="No reward source"):
        team(env_reward_weight=0.0)
    with pytest.raises(ValueError, match="not tools of the environment"):
        TRLEnvironmentTeam(COUNTER, agents=["a"], tools={"a": ["jump"]})


def test_agents_acting_one_after_another_see_the_earlier_actions_of_the_turn():
    env = team(max_turns=2)
    env.reset({"prompt": "Go.", "target": 1})
    first = env.step({"adder": call("increment", amount=3)})
    assert not first.done and first.team_reward == 0.0 and env.turn == 0
    assert "[adder] calls increment" in first.next_prompts["subtractor"][-1]["content"]
    with pytest.raises(ValueError, match="already acted"):
        env.clone().step({"adder": "again"})
    second = env.step({"subtractor": call("decrement", amount=2)})
    assert not second.done and env.turn == 1 and env.instance.value == 1
    env.step({"subtractor": "done"})
    last = env.step({"adder": "done"})
    assert last.done and last.team_reward == 1.0


def test_the_agent_turn_sampler_runs_the_team_in_sequence():
    from trl_multiagent.rollout import AgentTurnSampler

    def script(agent, prompt, k):
        return call("increment", amount=2) if agent == "adder" else call("decrement", amount=1)

    exp = AgentTurnSampler(num_samples=2, num_turns=1, agent_order="sequential").rollout(
        ScriptedPool(["adder", "subtractor"], script), lambda: team(max_turns=1), [{"prompt": "Go", "target": 1}],
        GenerationConfig())
    assert [j.reward for j in exp.joint_actions] == [0.0, 1.0]


def test_a_dict_of_environments_picks_by_row():
    from trl_multiagent.runtime.user_code import import_object

    counter = import_object(COUNTER)
    env = TRLEnvironmentTeam({"up": counter, "also": COUNTER}, agents=["a", "b"])
    env.validate_dataset_columns(["environment", "prompt"])
    with pytest.raises(ValueError, match="environment"):
        env.validate_dataset_columns(["prompt"])
    env.reset({"environment": "also", "target": 1})
    assert env.step({"a": call("increment", amount=1), "b": "ok"}).done is False


def test_the_tree_sampler_branches_the_environments_state():
    def script(agent, prompt, k):
        return call("increment", amount=1 + k) if agent == "adder" else "ok"

    exp = JointTreeSampler(num_samples=2, num_turns=2).rollout(
        ScriptedPool(["adder", "subtractor"], script), lambda: team(max_turns=2), [{"prompt": "Go", "target": 3}],
        GenerationConfig())
    final = [j for j in exp.joint_actions if j.done]
    # two first moves (1 or 2), each followed by two second moves: the counter ends at 2, 3, 3 or 4
    assert sorted(j.reward for j in final) == sorted([1 / 2, 1.0, 1.0, 1 / 2])


@pytest.fixture(scope="module")
def chatml_model(tmp_path_factory) -> str:
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    return save_tiny(tmp_path_factory.mktemp("tiny_chatml"), chars=chars, max_positions=2048)


def test_the_guides_recipe_trains_a_step_on_a_tiny_model(chatml_model, tmp_path):
    recipe, config, given = parse_recipe([
        "--config", RECIPE, "--model", chatml_model, "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
        "--max_completion_length", "4", "--num_generations", "2", "--num_turns", "1", "--episodes_per_step", "1",
        "--report_to", "none", "--disable_tqdm", "true", "--eval_num_problems", "2", "--eval_max_new_tokens", "2"])
    run = Run(recipe, config, given)
    run.prepare()
    trainer = run.build_trainer()
    output = trainer.train()
    assert output.global_step == 1
    prompt = trainer.pool.tokenizer_of("adder").decode(
        trainer.pool.encode_prompt("adder", run.env_factory().reset({"prompt": "Go", "target": 2})["adder"]))
    assert '"name": "increment"' in prompt and "decrement" not in prompt


def test_the_guide_shows_the_example_class_unchanged_and_the_recipe_as_it_is():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "guides" / "trl_environments.md").read_text()
    source = (root / "examples" / "trl_environments" / "counter_env.py").read_text()
    assert source[source.index("class CounterEnv"):].rstrip() in guide
    recipe = (root / RECIPE).read_text()
    block = guide.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert all(line in recipe.splitlines() for line in block.splitlines()), block


def test_the_episodes_evaluator_plays_the_team_over_several_turns():
    """Held-out evaluation of a multi-turn team whose prompts hold tool calls (lists in messages) and tools."""
    from trl_multiagent.evaluation import make_evaluator
    from trl_multiagent.evaluation.core import TEAM, evaluate_team
    from trl_multiagent.generation.requests import Generation

    class Pool:
        agent_names = ["adder", "subtractor"]

        def policy_of(self, agent):
            return agent

        def generate_many(self, requests, generation_config, max_batch_sequences=None, progress=None):
            out = []
            for req in requests:
                # the adder adds 2 each turn, the subtractor makes one bad call then stops
                text = call("increment", amount=2) if req.agent == "adder" else \
                    ("stop" if len(req.prompt) > 2 else call("jump"))
                out.append([Generation([0], [1], text) for _ in range(req.num_samples)])
            return out

    factory = lambda: team(max_turns=2)  # noqa: E731
    evaluator = make_evaluator("auto", factory, num_turns=2)
    result = evaluate_team(Pool(), evaluator, [{"task_id": "a", "prompt": "Go", "target": 4}], methods=[TEAM],
                           num_samples=2, generation_config=GenerationConfig(max_new_tokens=4))
    team_result = result.methods[TEAM]
    assert team_result.samples["return"] == [[1.0, 1.0]] and team_result.samples["turns"] == [[2.0, 2.0]]
    assert team_result.details["turn1/tool_failures"] == 1.0
