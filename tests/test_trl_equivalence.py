"""With one agent and one turn, MAGRPOTrainer's advantages, loss and gradients equal TRL GRPOTrainer's for
TRL's own loss types (selected by name; MAGRPO's default whole-response objective is tested in test_losses.py)."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent.credit import grouped_advantages
from trl_multiagent.environments import FunctionEnvironment
from trl_multiagent.models.loading import load_base_model, load_tokenizer
from trl_multiagent.rollout import Experience, Sample
from trl_multiagent.team.pool import AgentSpec, Generation
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

from .numerics import assert_same_computation
from .tiny import model_terms

K = 4


def char_score(completions=None, **kwargs):
    """Reward: a deterministic score of the text (works on TRL's list form and on our dict form)."""
    if isinstance(completions, dict):
        return _score(completions["solo"])
    return [_score(c) for c in completions]


def _score(text: str) -> float:
    return float(sum(map(ord, text)) % 5)


@pytest.mark.parametrize("loss_type,beta,entropy_coef", [("dapo", 0.0, 0.0), ("dapo", 0.05, 0.0), ("grpo", 0.05, 0.0),
                                                       ("dapo", 0.0, 0.5)])
def test_single_agent_matches_trl_grpo(tiny_text_model, tmp_path, loss_type, beta, entropy_coef):
    """``entropy_coef``: TRL's entropy bonus differentiates the entropy; its gradient reaches the adapter."""
    common = dict(num_generations=K, max_completion_length=6, learning_rate=1e-3, beta=beta, temperature=1.0,
                  entropy_coef=entropy_coef,
                  loss_type=loss_type, use_bias_correction_kl=True,
                  report_to=[], bf16=False, gradient_checkpointing=False, disable_tqdm=True, seed=0,
                  per_device_train_batch_size=K)
    lora = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")

    # ours: one agent, one turn
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["prompt"]}, char_score)  # noqa: E731
    data = Dataset.from_dict({"prompt": ["abc"] * 4})
    ours = MAGRPOTrainer([AgentSpec("solo", model=tiny_text_model, lora_r=4, lora_alpha=8)], env,
                                 MAGRPOConfig(output_dir=str(tmp_path / "ours"), **common), data)

    # TRL: same base, same LoRA weights (copied from ours, with B made non-zero so the adapter matters)
    with torch.no_grad():
        for n, p in ours.pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    trl = GRPOTrainer(model=load_base_model(tiny_text_model), reward_funcs=char_score,
                      args=GRPOConfig(output_dir=str(tmp_path / "trl"), **common),
                      train_dataset=data, processing_class=load_tokenizer(tiny_text_model),
                      peft_config=LoraConfig(task_type="CAUSAL_LM", **lora))
    state = get_peft_model_state_dict(ours.pool.base_of("solo"), adapter_name="solo")
    set_peft_model_state_dict(trl.model, state, adapter_name="default")

    torch.manual_seed(0)
    trl.model.train()
    trl_inputs = trl._generate_and_score_completions([{"prompt": "abc"}] * K)

    # the same completions and rewards, as our experience
    tok = load_tokenizer(tiny_text_model)
    samples, rewards = [], []
    for i in range(K):
        p_ids = trl_inputs["prompt_ids"][i][trl_inputs["prompt_mask"][i].bool()].tolist()
        c_ids = trl_inputs["completion_ids"][i][trl_inputs["completion_mask"][i].bool()].tolist()
        text = tok.decode(c_ids, skip_special_tokens=True)
        rewards.append(_score(text))
        samples.append(Sample(agent="solo", policy="solo", episode=0, turn=0, node=0, joint_ids=[i],
                              generation=Generation(p_ids, c_ids, text)))
    # TRL's pass and ours (shared prompt) sum in another order: compared with a tolerance from the summed terms
    terms = model_terms(trl_inputs["prompt_ids"].numel() + trl_inputs["completion_ids"].numel())
    advantages, _ = grouped_advantages(rewards, [0] * K, scale="group")
    # TRL normalises in float32 (a mean and a std of K rewards), ours in float64
    assert_same_computation(torch.tensor(advantages), trl_inputs["advantages"], terms=2 * K, what="advantages")
    for s, a in zip(samples, advantages):
        s.advantage = a
    if beta:
        batch = ours.collate("solo", samples)
        with ours.pool.reference("solo") as ref:
            ref_logps = ours.logps(ref, batch)
        for s, row, m in zip(samples, ref_logps, batch["completion_mask"]):
            s.ref_logps = row[m.bool()].tolist()
        assert_same_computation((ref_logps * batch["completion_mask"]).sum(),
                                (trl_inputs["ref_per_token_logps"] * trl_inputs["completion_mask"]).sum(),
                                terms=terms, what="reference log-probs")

    for t in (ours, trl):
        t.current_gradient_accumulation_steps = 1
    ours.pool.train()
    trl_loss = trl.compute_loss(trl.model, trl_inputs)
    trl_loss.backward()
    our_loss = ours.update(ours.model, Experience(samples, [], {}))
    assert_same_computation(our_loss.detach(), trl_loss.detach(), terms=terms, what="loss")
    assert abs(trl_loss.item()) > 0 or beta == 0.0

    trl_grads = {n.replace(".default", ""): p.grad for n, p in trl.model.named_parameters() if "lora_" in n}
    our_grads = {n.replace(".solo", ""): p.grad for n, p in ours.pool.base_of("solo").named_parameters()
                 if "lora_" in n}
    assert trl_grads.keys() == our_grads.keys()
    names = sorted(trl_grads)
    assert_same_computation([our_grads[n] for n in names], [trl_grads[n] for n in names], terms=terms,
                            what="LoRA gradients")
    assert any(g.abs().sum() > 0 for g in trl_grads.values())
