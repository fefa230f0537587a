"""The papers' objectives, checked against hand-computed losses and gradients on responses of unequal length.

- MAGRPO Eq. 2 / CoLLM Eq. 2, 4 (``loss_type="response"``): whole-response ratio, summed token log-probs.
- MHGPO Eq. 6-7 (TRL's ``"grpo"`` with the per-agent weights): per-token ratio, 1/|o|, 1/G_k, 1/n.
- AT-GRPO (TRL's ``"grpo"``): GRPO's per-response token mean, then the mean over responses.
- The critics' value loss (CoLLM Eq. 3 / 5; MAPoRL's clipped, masked PPO value loss).
"""

import functools
import math

import pytest
import torch
from datasets import Dataset

from tests.numerics import assert_same_computation
from tests.tiny import model_terms
from trl_multiagent.credit.losses import response_policy_loss, value_loss
from trl_multiagent.environments import FunctionEnvironment
from trl_multiagent.rollout import Experience, Sample
from trl_multiagent.team.pool import AgentSpec, Generation
from trl_multiagent.trainers import (
    CoLLMConfig,
    CoLLMTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MHGPOConfig,
)

TEMPERATURE = 0.5
#: the pure functions' tests build their own tensors in float64: hand-computed values are met far below any CPU's
#: rounding differences (tests/numerics.py)
F64 = torch.float64


# ------------------------------------------------------------------------------------------- the pure function
def test_response_loss_by_hand_ratio_clipped_and_summed_gradient():
    # response 0: 2 tokens, response 1: 3 tokens (padding in row 0 must not count)
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.2, -2.1, 0.0], [-0.5, -0.6, -0.4]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    loss, stats = response_policy_loss(lp, old, mask, adv, epsilon_low=0.2, epsilon_high=0.2)
    # row 0: log rho = -3.0 - (-3.3) = 0.3, rho = 1.3499 > 1.2 with A > 0 -> clipped: -min(1.35, 1.2) = -1.2, no grad
    # row 1: log rho = -1.5 - (-1.5) = 0, rho = 1: -(1 * -2) = 2; d/d lp_t = -A * rho = 2 for EVERY token (a sum)
    assert loss.item() == pytest.approx((-1.2 + 2.0) / 2)
    assert stats["ratio"].tolist() == pytest.approx([math.exp(0.3), 1.0])
    assert stats["clipped"].tolist() == [1.0, 0.0]
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64))


def test_response_loss_negative_advantage_is_not_clipped_above_and_kl_is_a_token_sum():
    lp = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.1, -1.1], [-2.0, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -0.5], [-2.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([-1.0, 0.5], dtype=F64)
    loss, stats = response_policy_loss(lp, old, mask, adv, 0.2, 0.2, ref_per_token_logps=ref, beta=0.1)
    rho0 = math.exp(0.2)  # 1.2214 > 1.2 but A < 0: min(rho * A, 1.2 * A) = rho * A (pessimistic side, not clipped)
    kl0 = (math.exp(-0.5) - (-0.5) - 1) + (math.exp(0.5) - 0.5 - 1)  # r = ref - lp = -0.5, +0.5; summed
    expected = ((rho0 * 1.0 + 0.1 * kl0) + (-0.5 + 0.0)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["kl"].tolist() == pytest.approx([kl0, 0.0])
    loss.backward()
    # d/d lp_t of rho0 * 1.0 = rho0 per token; of 0.1 * (e^{ref-lp} - (ref - lp) - 1) = 0.1 * (1 - e^{ref-lp})
    g0 = [(rho0 + 0.1 * (1 - math.exp(-0.5))) / 2, (rho0 + 0.1 * (1 - math.exp(0.5))) / 2]
    g1 = [-0.5 / 2, 0.0]
    assert torch.allclose(lp.grad, torch.tensor([g0, g1], dtype=F64), rtol=1e-6)


def test_response_loss_weights_split_a_batch_into_micro_batches():
    torch.manual_seed(0)
    lp = torch.randn(4, 5, dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=F64)
    whole, _ = response_policy_loss(lp, lp.detach(), mask, adv, 0.2, 0.2)
    parts = sum(response_policy_loss(lp[i:i + 2], lp.detach()[i:i + 2], mask[i:i + 2], adv[i:i + 2], 0.2, 0.2,
                                     weights=torch.full((2,), 0.25, dtype=F64))[0] for i in (0, 2))
    assert parts.item() == pytest.approx(whole.item())


# ------------------------------------------------------------------------------------------- value loss
def test_value_loss_is_mean_squared_td_error_with_constant_targets():
    values = torch.tensor([0.5, 1.5], dtype=F64, requires_grad=True)
    targets = torch.tensor([2.35, 0.0], dtype=F64)
    loss, _ = value_loss(values, targets)
    # ((2.35 - 0.5)^2 + (0 - 1.5)^2) / 2 = (3.4225 + 2.25) / 2
    assert loss.item() == pytest.approx(2.83625)
    loss.backward()
    # d/dV of mean (V - y)^2 = 2 (V - y) / n; the target is not differentiated
    assert values.grad.tolist() == pytest.approx([-1.85, 1.5])


def test_value_loss_clipping():
    values = torch.tensor([0.5, 1.5], dtype=F64)
    targets = torch.tensor([2.35, 0.0], dtype=F64)
    old = torch.tensor([0.0, 1.0], dtype=F64)
    # clip 0.2: clipped values 0.2 and 1.2; squared errors (0.2 - 2.35)^2 = 4.6225, (1.2 - 0)^2 = 1.44
    # max with the unclipped 3.4225 and 2.25 -> 4.6225 and 2.25, mean 3.43625
    assert value_loss(values, targets, old, clip=0.2)[0].item() == pytest.approx(3.43625)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(values, targets, clip=0.2)


def test_masked_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 9.0]], dtype=F64)
    old = torch.tensor([[0.5, 0.5, 0.0]], dtype=F64)
    returns = torch.tensor([[2.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    # token 1: clipped .7, max((1-2)^2, (.7-2)^2) = 1.69; token 2: clipped .3, max(0, .09) = .09; token 3 masked
    loss, stats = value_loss(values, returns, old, clip=0.2, mask=mask)
    assert loss.item() == pytest.approx((1.69 + 0.09) / 2)
    assert stats["clip_fraction"].item() == pytest.approx(1.0)
    loss, stats = value_loss(torch.tensor([[0.6]], dtype=F64), torch.tensor([[0.0]], dtype=F64),
                             torch.tensor([[0.5]], dtype=F64), clip=0.2, mask=torch.tensor([[1]]))
    assert loss.item() == pytest.approx(0.36) and stats["clip_fraction"].item() == 0.0


# ------------------------------------------------------------------------------------------- through the trainers
def _trainer(model_dir, tmp_path, config_cls=MAGRPOConfig, agents=("solo",), trainer_cls=None, **kw):
    env = lambda: FunctionEnvironment(list(agents), {a: (lambda t: t["prompt"]) for a in agents},  # noqa: E731
                                      lambda completions, **_: 0.0)
    kw.setdefault("num_generations", 2)
    kw.setdefault("model_dtype", "float64")  # two paths compared: float64 widens the margin (tests/numerics.py)
    args = config_cls(output_dir=str(tmp_path), report_to=[], max_completion_length=4,
                      temperature=TEMPERATURE, save_strategy="no", disable_tqdm=True,
                      per_device_train_batch_size=2, **kw)
    specs = [AgentSpec(a, model=model_dir, lora_r=4, lora_alpha=8) for a in agents]
    trainer = (trainer_cls or MAGRPOTrainer)(specs, env, args, Dataset.from_dict({"prompt": ["ab"] * 2}))
    with torch.no_grad():  # non-zero B so the adapter changes the log-probs
        for n, p in trainer.pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return trainer


def _samples(trainer, agent, completions, advantages, episodes=None):
    prompt = trainer.pool.encode_prompt(agent, "ab")
    episodes = episodes or [0] * len(completions)
    return [Sample(agent=agent, policy=trainer.pool.policy_of(agent), episode=e, turn=0, node=0, joint_ids=[],
                   generation=Generation(list(prompt), list(c), ""), advantage=a)
            for c, a, e in zip(completions, advantages, episodes)]


def _token_logps(trainer, sample):
    """log pi(a_t | ...) of every completion token from a plain forward of the adapted model (no fused head)."""
    base = trainer.pool.activate(sample.policy)
    p, c = sample.generation.prompt_ids, sample.generation.completion_ids
    ids = torch.tensor([p + c])
    logits = base(input_ids=ids).logits[0, len(p) - 1:len(p) + len(c) - 1] / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]


def _grads(trainer, policy):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.pool.policy_parameters(policy)]


def _check(trainer, samples, surrogate_terms, expected_loss):
    """update() gives ``expected_loss`` and the gradients of ``sum(surrogate_terms)`` (built by hand, one forward per
    sample): equal up to summation order, with a tolerance from the summed terms (tests/numerics.py); the loss's
    rounding is relative to the magnitudes of its terms, which may cancel."""
    trainer.pool.train()
    trainer.pool.zero_grad()
    loss = trainer.update(trainer.pool, Experience(samples, [], {}))
    terms = model_terms(sum(len(s.generation.prompt_ids) + len(s.generation.completion_ids) for s in samples))
    magnitude = max(abs(expected_loss), sum(abs(t.item()) for t in surrogate_terms))
    assert_same_computation(loss.detach(), torch.tensor(expected_loss), terms=terms, scale=magnitude, what="loss")
    ours = {p: _grads(trainer, p) for p in trainer.pool.policies}
    trainer.pool.zero_grad()
    sum(surrogate_terms).backward()
    for p in trainer.pool.policies:
        assert_same_computation(ours[p], _grads(trainer, p), terms=terms, what=f"{p}'s gradients")
    assert any(g.abs().sum() > 0 for p in ours for g in ours[p])


def test_magrpo_default_is_the_whole_response_objective(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path)
    assert trainer.args.loss_type == "response" and trainer.args.use_bias_correction_kl is False
    tok = trainer.pool.tokenizer_of("solo")
    ids = tok.convert_tokens_to_ids
    # unequal lengths: 1 and 3 tokens; with one update per rollout rho = 1, so the loss is -mean(A) and its
    # gradient is -(1/B) sum_b A_b * grad sum_t log pi(a_bt)  (a SUM over each response's tokens)
    samples = _samples(trainer, "solo", [[ids("c")], [ids("d"), ids("e"), ids("f")]], [1.5, -0.5])
    terms = [-s.advantage * _token_logps(trainer, s).sum() / 2 for s in samples]
    _check(trainer, samples, terms, expected_loss=-(1.5 - 0.5) / 2)


def test_collm_actor_uses_the_same_whole_response_objective(tiny_text_model, tmp_path):
    from trl_multiagent.trainers.base import MultiAgentTrainer

    trainer = _trainer(tiny_text_model, tmp_path, CoLLMConfig, trainer_cls=CoLLMTrainer,
                       num_generations=1, reward_max=1.0)
    assert trainer.args.loss_type == "response"
    ids = trainer.pool.tokenizer_of("solo").convert_tokens_to_ids
    # the actor's step of a minibatch (CoLLMTrainer.update after the critic's) on TD errors as advantages:
    # -(1/B) sum_b delta_b * grad sum_t log pi(a_bt), the same objective as MAGRPO's
    samples = _samples(trainer, "solo", [[ids("c"), ids("d")], [ids("e"), ids("f"), ids("g")]], [0.3, -0.8])
    terms = [-s.advantage * _token_logps(trainer, s).sum() / 2 for s in samples]
    trainer.update = functools.partial(MultiAgentTrainer.update, trainer)
    _check(trainer, samples, terms, expected_loss=-(0.3 - 0.8) / 2)


def test_at_grpo_default_is_grpos_per_response_token_mean(tiny_text_model, tmp_path):
    from trl_multiagent.trainers import ATGRPOConfig, ATGRPOTrainer

    trainer = _trainer(tiny_text_model, tmp_path, ATGRPOConfig, trainer_cls=ATGRPOTrainer, agent_order="parallel")
    assert trainer.args.loss_type == "grpo"
    ids = trainer.pool.tokenizer_of("solo").convert_tokens_to_ids
    samples = _samples(trainer, "solo", [[ids("c"), ids("d")], [ids("e")]], [1.0, -2.0])
    # per-token ratio = 1: loss = -(1/B) sum_b A_b; gradient -(1/B) sum_b A_b * (1/|o_b|) sum_t grad log pi(a_bt)
    terms = [-s.advantage * _token_logps(trainer, s).mean() / 2 for s in samples]
    _check(trainer, samples, terms, expected_loss=-(1.0 - 2.0) / 2)


def test_mhgpo_objective_weights_agents_groups_and_tokens(tiny_text_model, tmp_path):
    from tests.test_mhgpo_learning import TwoStageGame
    from trl_multiagent.trainers import MHGPOTrainer

    args = MHGPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=4, beta=0.1,
                                    temperature=TEMPERATURE, save_strategy="no", model_dtype="float64",
                                    disable_tqdm=True, per_device_train_batch_size=2)
    assert args.loss_type == "grpo" and args.agent_loss_weighting
    specs = [AgentSpec(a, model=tiny_text_model, lora_r=4, lora_alpha=8) for a in ("first", "second")]
    trainer = MHGPOTrainer(specs, TwoStageGame, args, Dataset.from_dict({"task_id": [0, 1]}))
    with torch.no_grad():
        for n, p in trainer.pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    ids = trainer.pool.tokenizer_of("first").convert_tokens_to_ids
    # one question; the first agent has a group of 2 samples, the second a group of 1 (groups differ in size):
    # Eq. 6 weighs each sample 1/n * 1/G_k: 1/2 * 1/2 for the first agent's, 1/2 * 1/1 for the second's; within a
    # response, 1/|o| of the per-token terms -rho_t * A + beta * KL_t (Eq. 7's estimator, no importance correction)
    first = _samples(trainer, "first", [[ids("c"), ids("d"), ids("e")], [ids("f")]], [1.0, -1.0])
    second = _samples(trainer, "second", [[ids("g"), ids("h")]], [0.7])
    weights = [0.25, 0.25, 0.5]
    samples = first + second
    terms, expected = [], 0.0
    for w, s in zip(weights, samples):
        with torch.no_grad(), trainer.pool.reference(s.policy):
            ref = _token_logps(trainer, s)
        s.ref_logps = ref.tolist()
        lp = _token_logps(trainer, s)
        rho = torch.exp(lp - lp.detach())
        kl = torch.exp(ref - lp) - (ref - lp) - 1
        term = w * (-rho * s.advantage + 0.1 * kl).mean()
        terms.append(term)
        expected += term.item()
    _check(trainer, samples, terms, expected_loss=expected)
