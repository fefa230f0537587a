"""CoLLMTrainer (CoLLM-CC / CoLLM-DC): critic inputs, gradient isolation, one critic step per update,
minibatch schedule, validation, recipes."""

import math
import warnings

import pytest
import torch
from datasets import Dataset

from tests.fake_pool import ScriptedPool
from tests.numerics import assert_same_computation
from tests.tiny import model_terms
from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.rollout import SinglePathSampler
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import CoLLMConfig, CoLLMTrainer, MAPoRLConfig
from trl_multiagent.trainers.collm import episode_returns

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
    buffer = SinglePathSampler(num_turns=3).rollout(pool, lambda: ThreeTurns(stop_after), [{}] * num_tasks, None)
    assert all(tr.ret == 0.0 for tr in buffer.transitions)
    episode_returns(buffer, gamma=1.0)  # the trainer's credit: the Monte-Carlo returns
    return buffer, pool


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), num_turns=3, episodes_per_step=2, max_completion_length=3,
                per_device_train_batch_size=8, learning_rate=1e-3, critic_learning_rate=1e-3, critic_lora_r=4,
                report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1,
                lr_scheduler_type="constant", seed=0)
    base.update(kw)
    return CoLLMConfig(**base)


def _trainer(model, tmp_path, env=ThreeTurns, **kw):
    agents = [AgentSpec(a, model=model, lora_r=4, lora_alpha=8) for a in AGENTS]
    return CoLLMTrainer(agents, env, _args(tmp_path, **kw), Dataset.from_dict({"task_id": list(range(16))}))


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

    dc = _trainer(tiny_text_model, tmp_path / "dc", critic="decentralized", critic_global_info=False)
    assert sorted(dc.pool.critics) == ["critic_left", "critic_right"]
    own = dc.critic_text(buffer, last.index, "critic_left")
    assert "observation of left at turn 2" in own and "reply of left" in own
    assert "right" not in own and "[global]" not in own  # only its own local history
    assert "left" not in dc.critic_text(buffer, last.index, "critic_right")

    short = _trainer(tiny_text_model, tmp_path / "short", critic="centralized", critic_history_turns=0)
    text = short.critic_text(buffer, last.index, "critic")
    assert "turn 1" not in text.replace("[global] This is turn 3", "") and "observation of left at turn 2" in text


def test_decentralized_critics_read_global_info_by_default(tiny_text_model, tmp_path):
    # issue 35 point 2, CoLLM App. E: "we provide DC and CC with the following global information m_t during
    # training" (Sec. 6: "in both CC and DC for consistency"). The DC default is now the paper's: each critic reads
    # m_t, then ONLY its own agent's history. By hand, for turn 3 of 3 after the rewards 1 and 2 of ThreeTurns
    # (reward_max 3): "[global] This is turn 3 of a 3-turn episode. Reward of the previous turn: 2 (a turn earns at
    # most 3)." and a blank line. (The old default, m_t for CC only, gave a DC critic its history alone.)
    buffer, _ = _scripted_buffer()
    last = buffer.transitions[2]
    dc = _trainer(tiny_text_model, tmp_path / "dc", critic="decentralized")
    assert dc.args.critic_global_info is True
    local = _trainer(tiny_text_model, tmp_path / "local", critic="decentralized", critic_global_info=False)
    m_t = "[global] This is turn 3 of a 3-turn episode. Reward of the previous turn: 2 (a turn earns at most 3).\n\n"
    for agent in AGENTS:
        history = local.critic_text(buffer, last.index, f"critic_{agent}")
        assert history.startswith(f"[{agent}]") and "[global]" not in history
        assert dc.critic_parts(buffer, last.index, f"critic_{agent}") == (m_t, history)
    # at turn 1 there is no previous reward yet
    first = ("[global] This is turn 1 of a 3-turn episode. Reward of the previous turn: none yet (a turn earns at "
             "most 3).")
    assert dc.critic_text(buffer, buffer.transitions[0].index, "critic_left").startswith(first)


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

    tokens = []

    def spy(critic, input_ids, attention_mask, head=None):
        calls.append((critic, input_ids.shape[0], torch.is_grad_enabled()))
        tokens.append(input_ids.numel())
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
    # the update's batches and this one sum in another order (tests/numerics.py)
    terms = model_terms(sum(tokens))
    assert_same_computation(loss.detach(), expected_loss.detach(), terms=terms, what="critic loss")
    assert_same_computation(got, trainer.pool.value_heads["critic"].linear.weight.grad, terms=terms,
                            what="value head gradient")
    assert_same_computation(torch.tensor([deltas["critic"][tr.index] for tr in buffer.transitions]),
                            targets - values.detach(), terms=terms, what="TD errors")


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


def test_td_error_normalization_per_turn_reaches_the_advantages(tiny_text_model, tmp_path):
    # the authors' released code (CoMLRL, advantage_normalization): each turn's TD errors in the minibatch are
    # normalised (population std). Two episodes x 3 turns; the critic's TD errors are replaced by hand: turn t of
    # episode e gets 0.1 * t + 0.3 * e, so every turn holds {x, x + 0.3}: normalised -1 and +1.
    trainer = _trainer(tiny_text_model, tmp_path, critic="centralized", td_error_normalization=True, max_steps=1)
    buffer = trainer.rollout([{"task_id": 0}, {"task_id": 1}])
    zero = torch.zeros((), device=trainer.accelerator.device)
    trainer._critic_update = lambda buf, transitions: (zero, {"critic": {
        tr.index: 0.1 * tr.turn + 0.3 * tr.episode for tr in transitions}})
    trainer.update(trainer.model, buffer)
    for tr in buffer.transitions:
        assert tr.samples["left"].advantage == pytest.approx(-1.0 if tr.episode == 0 else 1.0)


def test_epochs_and_minibatches_reuse_one_rollout(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, critic="decentralized", num_iterations=2, num_minibatches=2,
                       max_steps=4, cliprange_value=0.5)
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


# ------------------------------------------------------------------------------------------------ the actor
def _actor_step(trainer, offsets, advantages):
    """One actor loss of ``left`` on two scripted responses whose behaviour log-probs are the current ones minus
    ``offsets[b]`` per token (so log rho_b = offsets[b] * len_b); returns the loss and the gradients of ``left``'s
    adapter, and the current token log-probs (with grad) for the hand-built surrogate."""
    import functools

    from trl_multiagent.rollout import Experience, Sample
    from trl_multiagent.team.pool import Generation
    from trl_multiagent.trainers.base import MultiAgentTrainer

    with torch.no_grad():  # non-zero B so that the adapter's log-probs have a gradient everywhere
        for n, p in trainer.pool.named_parameters():
            if "lora_B.left" in n:
                p.normal_(0, 0.3)
    prompt = trainer.pool.encode_prompt("left", "ab")
    ids = trainer.pool.tokenizer_of("left").convert_tokens_to_ids
    completions = [[ids("c"), ids("d")], [ids("e"), ids("f"), ids("g")]]
    samples = [Sample(agent="left", policy="left", episode=0, turn=0, node=0, joint_ids=[],
                      generation=Generation(list(prompt), c, ""), advantage=a) for c, a in zip(completions, advantages)]
    model = functools.partial(trainer.pool, "left")
    batch = trainer.collate("left", samples)
    with torch.no_grad():
        current = trainer.logps(model, batch)
    for s, row, m, off in zip(samples, current, batch["completion_mask"], offsets):
        s.old_logps = [x - off for x in row[m.bool()].tolist()]
    trainer.pool.train()
    trainer.pool.zero_grad()
    loss = MultiAgentTrainer.update(trainer, trainer.pool, Experience(samples, [], {}))
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
             for p in trainer.pool.policy_parameters("left")]
    trainer.pool.zero_grad()
    logps = trainer.logps(model, trainer.collate("left", samples))
    return loss, grads, logps, batch["completion_mask"]


def test_actor_is_the_unclipped_ratio_objective_of_eq_2_and_4(tiny_text_model, tmp_path):
    # issue 35 point 6. CoLLM Eq. 2 / Eq. 4: grad J = E[rho * grad log pi(a|h) * delta], no clip (the authors' actor
    # minimises -log p * A). Two responses, 2 and 3 tokens, reused off-policy:
    #   response 0: behaviour log-probs 0.15 below the current ones per token: log rho0 = 2 * 0.15 = 0.3,
    #               rho0 = e^0.3 = 1.34986, delta0 = +1
    #   response 1: 0.1 above per token: log rho1 = -0.3, rho1 = e^-0.3 = 0.74082, delta1 = -2
    # paper (default, actor_ratio_clip None): loss = -(rho0 * 1 + rho1 * (-2)) / 2 = (-1.34986 + 1.48164) / 2
    #   = 0.06589, gradient -(rho_b * delta_b / 2) * grad sum_t log pi(a_bt) for both responses;
    # old default (ratio clipped to [0.8, 1.2], "epsilon" 0.2): -min(1.34986, 1.2) = -1.2 and
    #   -min(0.74082 * -2, 0.8 * -2) = 1.6, loss (-1.2 + 1.6) / 2 = 0.2 and NO gradient (both clipped).
    rho0, rho1 = math.exp(0.3), math.exp(-0.3)
    trainer = _trainer(tiny_text_model, tmp_path, critic="decentralized", per_device_train_batch_size=2)
    assert trainer.args.actor_ratio_clip is None and trainer.epsilon_low == trainer.epsilon_high == math.inf
    loss, grads, logps, mask = _actor_step(trainer, [0.15, -0.1], [1.0, -2.0])
    # the loss and its gradients against a second pass: equal up to summation order (tests/numerics.py); the loss
    # is a difference of rho * delta terms, each rounded through its log-ratio: its rounding is relative to the sum
    # of |rho_b delta_b| times the log-probs' magnitudes (current and behaviour), not to the small difference
    terms = model_terms(mask.numel() + mask.size(0) * len(trainer.pool.encode_prompt("left", "ab")))
    # (mean over the 2 responses of |rho delta| x (sum |log pi| + sum |log pi_old|), the two sums about equal)
    magnitude = sum(abs(rho * delta) * (lp * m).abs().sum().item()
                    for rho, delta, lp, m in zip((rho0, rho1), (1.0, -2.0), logps, mask))
    assert_same_computation(loss.detach(), torch.tensor((-rho0 * 1.0 + rho1 * 2.0) / 2), terms=terms,
                            scale=magnitude, what="loss")
    assert loss.item() == pytest.approx(0.0658923, abs=1e-5)  # (-1.34986 + 1.48164) / 2, not the clipped 0.2
    hand = sum(-(rho * delta / 2) * (lp * m).sum() for rho, delta, lp, m in zip((rho0, rho1), (1.0, -2.0), logps, mask))
    hand.backward()
    hand_grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainer.pool.policy_parameters("left")]
    assert any(g.abs().sum() > 0 for g in grads)
    assert_same_computation(grads, hand_grads, terms=terms, what="actor gradients")

    # the clip stays available, named for what it clips: actor_ratio_clip 0.2 gives the old numbers
    clipped = _trainer(tiny_text_model, tmp_path / "clip", critic="decentralized", per_device_train_batch_size=2,
                       actor_ratio_clip=0.2)
    loss, grads, _, _ = _actor_step(clipped, [0.15, -0.1], [1.0, -2.0])
    assert loss.item() == pytest.approx((-1.2 + 1.6) / 2, abs=1e-5)
    assert all(g.abs().sum() == 0 for g in grads)


def test_epsilon_is_a_deprecated_alias_of_actor_ratio_clip(tmp_path):
    from trl_multiagent.trainers import critic_config

    critic_config._warned.clear()
    with pytest.warns(FutureWarning, match="actor_ratio_clip"):
        config = _args(tmp_path, epsilon=0.05)
    assert config.actor_ratio_clip == 0.05 and config.epsilon is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second config with the old name does not warn again
        assert _args(tmp_path, epsilon=0.05).actor_ratio_clip == 0.05
        assert _args(tmp_path).actor_ratio_clip is None


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs, message", [
    ({"num_generations": 2}, "num_generations must be 1"),
    ({"critic": "shared"}, "critic must be one of"),
    ({"critic_share_adapter": True}, "parameter-sharing variant of CoLLM-DC"),
    ({"num_minibatches": 3}, "must not exceed episodes_per_step"),
    ({"num_iterations": 0}, "num_iterations"),
    ({"cliprange_value": -1.0}, "cliprange_value must be >= 0"),
    ({"num_epochs": 2, "num_iterations": 3}, "disagree"),
    ({"critic_history_turns": -2}, "critic_history_turns"),
    ({"num_generations": 4}, "num_generations must be 1"),
    ({"critic_micro_batch_size": 0}, "critic_micro_batch_size must be at least 1"),
    ({"actor_ratio_clip": 0.0}, "actor_ratio_clip must be positive"),
    ({"epsilon_high": 0.3}, "epsilon_high is not used"),
    ({"epsilon": 0.1, "actor_ratio_clip": 0.2}, "disagree"),
])
def test_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _args(tmp_path, **kwargs)


def test_missing_reward_max_fails_before_any_model_loads(tmp_path):
    class NoMax(ThreeTurns):
        reward_max = None

    agents = [AgentSpec(a, model=str(tmp_path / "no-such-model")) for a in AGENTS]
    with pytest.raises(ValueError, match="set reward_max"):
        CoLLMTrainer(agents, NoMax, _args(tmp_path), Dataset.from_dict({"task_id": [0]}))
    # decentralized critics read m_t too by default (the paper's), so they need reward_max as well ...
    with pytest.raises(ValueError, match="set reward_max"):
        CoLLMTrainer(agents, NoMax, _args(tmp_path, critic="decentralized"), Dataset.from_dict({"task_id": [0]}))
    # ... and without m_t they need none; the error is then the missing model
    with pytest.raises(Exception, match="no-such-model"):
        CoLLMTrainer(agents, NoMax, _args(tmp_path, critic="decentralized", critic_global_info=False),
                           Dataset.from_dict({"task_id": [0]}))


# ------------------------------------------------------------------------------------------------ recipes
def test_recipes_parse(tmp_path):
    from pathlib import Path

    from trl_multiagent.command.cli import load_recipe

    configs = sorted(Path("recipes/configs").glob("*_cc.yaml")) + sorted(Path("recipes/configs").glob("*_dc.yaml"))
    names = {p.name for p in configs}
    for task in ("strbuild", "housebuild", "tldr", "coding"):
        assert f"{task}_cc.yaml" in names and f"{task}_dc.yaml" in names
    for path in configs:
        recipe, config = load_recipe(["--config", str(path), "--output_dir", str(tmp_path)])
        assert recipe.trainer == "collm" and isinstance(config, CoLLMConfig)
        assert config.critic == ("centralized" if path.name.endswith("_cc.yaml") else "decentralized")


@pytest.mark.parametrize("name", ["tldr_hub_cc", "arxiv_hub_cc"])
def test_hub_writing_recipes_fail_clearly_offline(tmp_path, monkeypatch, name):
    import datasets

    from trl_multiagent.command import recipe as recipe_module
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.runner import Run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "no-cache", raising=False)
    recipe, config = load_recipe(["--config", f"recipes/configs/{name}.yaml",
                                                "--output_dir", str(tmp_path)])
    assert recipe.dataset in ("trl-lib/tldr", "gfissore/arxiv-abstracts-2021")

    class NeverBuilt(CoLLMTrainer):  # the data fails first: no model is ever loaded here
        def __init__(self, *args, **kwargs):
            raise AssertionError("the trainer was reached although the dataset cannot load offline")

    monkeypatch.setattr(recipe_module, "_trainer_registry",
                        lambda: {"collm": (CoLLMConfig, NeverBuilt)})
    with pytest.raises(recipe_module.RecipeError, match="reachable Hugging Face Hub"):
        run = Run(recipe, config)
        run.prepare()
        run.build_trainer()


def test_old_critic_setting_names_are_deprecated_aliases(tmp_path):
    """One name per critic setting, shared with the debate trainer (trainers/critic_config.py): the actor-critic
    trainer's old names still work, with a warning, and land in the current fields."""
    from trl_multiagent.trainers import critic_config

    critic_config._warned.clear()
    with pytest.warns(FutureWarning, match="num_epochs is deprecated: use num_iterations"):
        args = CoLLMConfig(output_dir=str(tmp_path), report_to=[], num_epochs=2, value_clip=0.5,
                                 episodes_per_step=2)
    assert (args.num_iterations, args.cliprange_value) == (2, 0.5)
    assert args.num_epochs is None and args.value_clip is None  # each setting under one name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is given once per process
        CoLLMConfig(output_dir=str(tmp_path), report_to=[], num_epochs=2, value_clip=0.5, episodes_per_step=2)
    assert MAPoRLConfig.fsdp_refusal == CoLLMConfig.fsdp_refusal == critic_config.CRITIC_FSDP_REFUSAL
