"""ActorCriticTrainer (CoLLM-CC / CoLLM-DC): critic inputs, gradient isolation, one critic step per update,
minibatch schedule, validation, recipes."""

import pytest
import torch
from datasets import Dataset

from tests.fake_pool import ScriptedPool
from trl_multiagent.agents import AgentSpec
from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.rollout import SinglePathSampler
from trl_multiagent.trainers import ActorCriticConfig, ActorCriticTrainer

AGENTS = ("left", "right")


class ThreeTurns(Environment):
    """Three turns; each agent's observation names the agent and the turn; reward t + 1 after turn t; with
    ``stop_after`` the episode ends early after that turn."""

    agents = AGENTS
    max_turns = 3
    reward_max = 3.0

    def __init__(self, stop_after: int | None = None):
        self.stop_after = stop_after

    def obs(self, agent, t):
        return f"observation of {agent} at turn {t}"

    def reset(self, task):
        self.t = 0
        return {a: self.obs(a, 0) for a in self.agents}

    def step(self, joint_action):
        reward = float(self.t + 1)
        done = self.t + 1 >= self.max_turns or self.t == self.stop_after
        self.t += 1
        return StepResult(reward, None if done else {a: self.obs(a, self.t) for a in self.agents}, done)


def _scripted_buffer(num_tasks=1, stop_after=None):
    """A buffer from the real single-path sampler with scripted responses ``<agent> says <k> at <prompt>``."""
    pool = ScriptedPool(AGENTS, lambda agent, prompt, k: f"reply of {agent} to '{prompt}'")
    return SinglePathSampler(num_turns=3).rollout(pool, lambda: ThreeTurns(stop_after), [{}] * num_tasks, None), pool


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), num_turns=3, episodes_per_step=2, max_completion_length=3,
                per_device_train_batch_size=8, learning_rate=1e-3, critic_learning_rate=1e-3, critic_lora_r=4,
                report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1,
                lr_scheduler_type="constant", seed=0)
    base.update(kw)
    return ActorCriticConfig(**base)


def _trainer(model, tmp_path, env=ThreeTurns, **kw):
    agents = [AgentSpec(a, model=model, lora_r=4, lora_alpha=8) for a in AGENTS]
    return ActorCriticTrainer(agents, env, _args(tmp_path, **kw), Dataset.from_dict({"task_id": list(range(16))}))


# ------------------------------------------------------------------------------------------------ the buffer
def test_single_path_buffer_links_turns_and_stops_early():
    buffer, pool = _scripted_buffer(num_tasks=2, stop_after=1)
    assert pool.calls == [("left", 2, 1), ("right", 2, 1), ("left", 2, 1), ("right", 2, 1)]  # one path, batched
    assert [(tr.episode, tr.turn, tr.done, tr.reward) for tr in buffer.transitions] == \
        [(0, 0, False, 1.0), (1, 0, False, 1.0), (0, 1, True, 2.0), (1, 1, True, 2.0)]
    first, second = buffer.transitions[0], buffer.transitions[2]
    assert first.next == second.index and second.previous == first.index and second.next is None
    assert [tr.ret for tr in buffer.transitions] == [3.0, 3.0, 2.0, 2.0]  # MC returns, gamma = 1
    assert buffer.history(second.index, "left") == [("observation of left at turn 0",
                                                     "reply of left to 'observation of left at turn 0'"),
                                                    ("observation of left at turn 1", None)]
    assert buffer.history(second.index, "left", max_turns=0) == [("observation of left at turn 1", None)]
    assert buffer.last_reward(second.index) == 1.0 and buffer.last_reward(first.index) is None


# ------------------------------------------------------------------------------------------------ critic inputs
def test_centralized_critic_reads_every_history_and_global_info_decentralized_only_its_own(tiny_text_model, tmp_path):
    buffer, _ = _scripted_buffer()
    last = buffer.transitions[2]  # turn 2 of 3
    cc = _trainer(tiny_text_model, tmp_path / "cc", critic="centralized")
    text = cc.critic_text(buffer, last.index, "critic")
    for agent in AGENTS:
        for t in range(3):
            assert f"observation of {agent} at turn {t}" in text
        for t in range(2):
            assert f"reply of {agent} to 'observation of {agent} at turn {t}'" in text
    assert "[global] This is turn 3 of a 3-turn episode. Reward of the previous turn: 2" in text
    assert "at most 3)" in text
    assert text.rstrip().endswith("observation of right at turn 2")  # the value is read after the current observations

    dc = _trainer(tiny_text_model, tmp_path / "dc", critic="decentralized")
    assert sorted(dc.pool.critics) == ["critic_left", "critic_right"]
    own = dc.critic_text(buffer, last.index, "critic_left")
    assert "observation of left at turn 2" in own and "reply of left" in own
    assert "right" not in own and "[global]" not in own  # only its own local history
    assert "left" not in dc.critic_text(buffer, last.index, "critic_right")

    dc_info = _trainer(tiny_text_model, tmp_path / "dci", critic="decentralized", critic_global_info=True)
    assert "[global] This is turn 3" in dc_info.critic_text(buffer, last.index, "critic_left")

    short = _trainer(tiny_text_model, tmp_path / "short", critic="centralized", critic_history_turns=0)
    text = short.critic_text(buffer, last.index, "critic")
    assert "turn 1" not in text.replace("[global] This is turn 3", "") and "observation of left at turn 2" in text


def test_critic_input_truncation_keeps_global_info(tiny_text_model, tmp_path):
    buffer, _ = _scripted_buffer()
    trainer = _trainer(tiny_text_model, tmp_path, critic_max_length=120)
    header, body = trainer.critic_parts(buffer, 2, "critic")
    ids = trainer._critic_ids("critic", header, body)
    tok = trainer.pool.tokenizer_of("critic")
    assert len(ids) == 120
    assert ids[:len(tok(header)["input_ids"])] == tok(header)["input_ids"]  # m_t kept at the front
    assert ids[-10:] == tok(header + body)["input_ids"][-10:]  # the newest tokens kept


# ------------------------------------------------------------------------------------------------ gradients
def _zero_grads(trainer):
    for p in trainer.pool.parameters():
        p.grad = None


def _perturb_heads(trainer):
    with torch.no_grad():
        for head in trainer.pool.value_heads.values():
            head.linear.weight.normal_(0, 0.5)


def test_critic_loss_reaches_only_the_critics_adapter_and_head(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, critic="centralized")
    _perturb_heads(trainer)  # a zero head passes no gradient to the adapter
    buffer, _ = _scripted_buffer()
    _zero_grads(trainer)
    trainer._critic_update(buffer, buffer.transitions)
    mine = {id(p) for p in trainer.pool.critic_parameters("critic")}
    lora_b = [p for n, p in trainer.pool.named_parameters() if ".lora_B.critic." in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.pool.value_heads["critic"].parameters())
    others = [p for p in trainer.pool.parameters() if id(p) not in mine]
    assert others and all(p.grad is None for p in others)  # no policy adapter, no frozen base weight


def test_shared_adapter_critic_trains_its_agents_adapter_only(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, critic="decentralized", critic_share_adapter=True)
    _perturb_heads(trainer)
    with torch.no_grad():
        for p in trainer.pool.policy_parameters("left") + trainer.pool.policy_parameters("right"):
            p.normal_(0, 0.1)
    buffer, _ = _scripted_buffer()
    _zero_grads(trainer)
    trainer._critic_update(buffer, buffer.transitions)
    # CoLLM-DC's parameter-sharing variant: each critic's loss trains its head and ITS agent's policy adapter
    assert all(p.grad is not None for p in trainer.pool.policy_parameters("left"))
    assert all(p.grad is not None for p in trainer.pool.policy_parameters("right"))
    # with critic_right's head at zero, only critic_left's loss can move an adapter: left's, never right's
    _zero_grads(trainer)
    with torch.no_grad():
        trainer.pool.value_heads["critic_right"].linear.weight.zero_()
    trainer._critic_update(buffer, buffer.transitions)
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in trainer.pool.policy_parameters("right"))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.pool.policy_parameters("left"))


@pytest.mark.parametrize("micro", [None, 1])
def test_centralized_critic_loss_is_one_mean_over_joint_transitions(tiny_text_model, tmp_path, micro):
    """The CoMLRL bug: the shared critic stepped once per agent on duplicated samples. Here its gradient is that of
    ONE mean squared TD error over the minibatch's joint transitions, computed independently below (also when the
    value loss runs one critic input per pass, ``critic_micro_batch_size=1``)."""
    trainer = _trainer(tiny_text_model, tmp_path, critic="centralized", gamma=0.9, critic_micro_batch_size=micro)
    _perturb_heads(trainer)
    buffer, _ = _scripted_buffer(num_tasks=2, stop_after=1)
    calls = []
    original = trainer.pool.values

    def spy(critic, input_ids, attention_mask, head=None):
        calls.append((critic, input_ids.shape[0], torch.is_grad_enabled()))
        return original(critic, input_ids, attention_mask, head)

    trainer.pool.values = spy
    _zero_grads(trainer)
    loss, deltas = trainer._critic_update(buffer, buffer.transitions)
    trainer.pool.values = original
    # the 4 joint transitions with gradient (not 8 = agents x transitions), one batch for the 2 successors
    with_grad = [("critic", 4, True)] if micro is None else [("critic", 1, True)] * 4
    assert sorted(calls) == sorted([("critic", 2, False)] + with_grad)
    got = trainer.pool.value_heads["critic"].linear.weight.grad.clone()

    _zero_grads(trainer)
    texts = [trainer.critic_parts(buffer, tr.index, "critic") for tr in buffer.transitions]
    values = trainer._values("critic", texts, grad=True)
    with torch.no_grad():
        v = values.tolist()
    by_index = {tr.index: v[k] for k, tr in enumerate(buffer.transitions)}
    targets = torch.tensor([tr.reward + (0.0 if tr.done else 0.9 * by_index[tr.next]) for tr in buffer.transitions])
    expected_loss = ((values - targets) ** 2).mean()
    expected_loss.backward()
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    assert torch.allclose(got, trainer.pool.value_heads["critic"].linear.weight.grad, atol=1e-6)
    assert [deltas["critic"][tr.index] for tr in buffer.transitions] == pytest.approx(
        (targets - values.detach()).tolist(), abs=1e-5)


def test_one_critic_step_per_update_and_td_advantages(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, critic="centralized", max_steps=3)
    rollouts = []
    original = trainer.rollout
    trainer.rollout = lambda tasks: rollouts.append(1) or original(tasks)
    trainer.train()
    assert trainer.state.global_step == 3 and len(rollouts) == 3  # E = M = 1: one rollout per update
    optimizer = trainer.optimizer
    groups = {g.get("critic") or g.get("policy"): g for g in optimizer.param_groups}
    assert groups["critic"]["lr"] == 1e-3 and "left" in groups and "right" in groups
    head_weight = trainer.pool.value_heads["critic"].linear.weight
    assert int(optimizer.state[head_weight]["step"]) == 3  # stepped exactly once per update
    for policy in ("left", "right"):
        assert int(optimizer.state[trainer.pool.policy_parameters(policy)[0]]["step"]) == 3
    # every agent's sample of a transition carries that transition's TD error from the one critic
    buffer = trainer._buffered_inputs
    for tr in buffer.transitions:
        assert tr.samples["left"].advantage == tr.samples["right"].advantage
    import json
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algorithm"] == "CoLLM-CC" and summary["config"]["critic"] == "centralized"
    assert (tmp_path / "adapters" / "critic" / "value_head.safetensors").is_file()


def test_epochs_and_minibatches_reuse_one_rollout(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, critic="decentralized", num_epochs=2, num_minibatches=2,
                       max_steps=4, value_clip=0.5)
    assert trainer.num_iterations == 4
    seen = []
    original_update = trainer._critic_update

    def spy(buffer, transitions):
        seen.append(sorted(tr.index for tr in transitions))
        return original_update(buffer, transitions)

    trainer._critic_update = spy
    trainer.train()
    buffer = trainer._buffered_inputs
    everything = list(range(len(buffer.transitions)))
    assert len(seen) == 4 and all(seen)  # 2 epochs x 2 minibatches, none empty
    assert sorted(seen[0] + seen[1]) == everything and sorted(seen[2] + seen[3]) == everything
    assert all(s.old_logps is not None for s in buffer.samples)  # behaviour log-probs for the reused buffer
    assert all(set(tr.old_values) == {"critic_left", "critic_right"} for tr in buffer.transitions)  # value clipping
    # DC: each agent's advantage comes from its own critic
    assert any(tr.samples["left"].advantage != tr.samples["right"].advantage for tr in buffer.transitions)


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs, message", [
    ({"num_generations": 2}, "num_generations must be 1"),
    ({"critic": "shared"}, "critic must be one of"),
    ({"critic_share_adapter": True}, "parameter-sharing variant of CoLLM-DC"),
    ({"num_minibatches": 3}, "must not exceed episodes_per_step"),
    ({"num_iterations": 2}, "set num_epochs"),
    ({"value_clip": 0.0}, "value_clip must be positive"),
    ({"num_epochs": 0}, "num_epochs must be at least 1"),
    ({"critic_history_turns": -2}, "critic_history_turns"),
    ({"num_generations": 4}, "num_generations must be 1"),
    ({"critic_micro_batch_size": 0}, "critic_micro_batch_size must be at least 1"),
])
def test_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _args(tmp_path, **kwargs)


def test_missing_reward_max_fails_before_any_model_loads(tmp_path):
    class NoMax(ThreeTurns):
        reward_max = None

    agents = [AgentSpec(a, model=str(tmp_path / "no-such-model")) for a in AGENTS]
    with pytest.raises(ValueError, match="set reward_max"):
        ActorCriticTrainer(agents, NoMax, _args(tmp_path), Dataset.from_dict({"task_id": [0]}))
    # decentralized critics without m_t need no reward_max; the error is then the missing model
    with pytest.raises(Exception, match="no-such-model"):
        ActorCriticTrainer(agents, NoMax, _args(tmp_path, critic="decentralized"), Dataset.from_dict({"task_id": [0]}))


# ------------------------------------------------------------------------------------------------ recipes
def test_recipes_parse(tmp_path):
    from pathlib import Path

    from trl_multiagent.cli import load_recipe

    configs = sorted(Path("recipes/configs").glob("*_cc.yaml")) + sorted(Path("recipes/configs").glob("*_dc.yaml"))
    names = {p.name for p in configs}
    for task in ("strbuild", "housebuild", "tldr", "coding"):
        assert f"{task}_cc.yaml" in names and f"{task}_dc.yaml" in names
    for path in configs:
        recipe, config = load_recipe(["--config", str(path), "--output_dir", str(tmp_path)])
        assert recipe.trainer == "actor_critic" and isinstance(config, ActorCriticConfig)
        assert config.critic == ("centralized" if path.name.endswith("_cc.yaml") else "decentralized")


@pytest.mark.parametrize("name", ["tldr_hub_cc", "arxiv_hub_cc"])
def test_hub_writing_recipes_fail_clearly_offline(tmp_path, monkeypatch, name):
    import datasets

    from trl_multiagent import recipe as recipe_module
    from trl_multiagent.cli import load_recipe

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "no-cache", raising=False)
    recipe, config = load_recipe(["--config", f"recipes/configs/{name}.yaml",
                                                "--output_dir", str(tmp_path)])
    assert recipe.dataset in ("trl-lib/tldr", "gfissore/arxiv-abstracts-2021")

    class NeverBuilt:  # the data fails first: no model is ever loaded here
        def __init__(self, *args, **kwargs):
            raise AssertionError("the trainer was reached although the dataset cannot load offline")

    monkeypatch.setattr(recipe_module, "_trainer_registry",
                        lambda: {"actor_critic": (ActorCriticConfig, NeverBuilt)})
    with pytest.raises(recipe_module.RecipeError, match="reachable Hugging Face Hub"):
        recipe_module.build_trainer(recipe, config)
