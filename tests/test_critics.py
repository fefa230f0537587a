"""Critics (value models) on the team's bases: one base copy, gradient isolation, heads, save/reload."""

import pytest
import torch

from trl_multiagent.team.critics import CriticSpec, select_head
from trl_multiagent.team.pool import AgentPool, AgentSpec


def _ids(pool, name, texts):
    tok = pool.tokenizer_of(name)
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):  # left padding, as prompts are padded
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def _others(pool, critic):
    """Every trainable tensor that is not the critic's own, and the frozen base weights."""
    mine = {id(p) for p in pool.critic_parameters(critic)}
    return [p for n, p in pool.named_parameters() if id(p) not in mine]


def test_critic_shares_the_base_and_its_loss_reaches_only_its_adapter_and_head(tiny_text_model):
    pool = AgentPool([AgentSpec("actor", model=tiny_text_model, lora_r=4), AgentSpec("buddy", model=tiny_text_model, lora_r=4)],
                     critics=[CriticSpec("critic", agent="actor", lora_r=4)])
    assert len(pool.bases) == 1  # the critic is one more adapter on the one base
    params = pool.critic_parameters("critic")
    assert {id(p) for p in pool.value_heads["critic"].parameters()} <= {id(p) for p in params}
    assert not {id(p) for p in params} & {id(p) for pol in pool.policies for p in pool.policy_parameters(pol)}
    ids, mask = _ids(pool, "critic", ["hello there", "hi"])
    values = pool.values("critic", ids, mask)
    assert values.shape == ids.shape and torch.all(values == 0)  # zero-initialised head: V = 0 at the start
    with torch.no_grad():
        pool.value_heads["critic"].linear.weight.normal_(0, 0.1)  # a non-zero head, so gradients reach the adapter
    loss = (pool.values("critic", ids, mask)[:, -1] - torch.tensor([1.0, -1.0])).pow(2).mean()
    loss.backward()
    lora_b = [p for n, p in pool.named_parameters() if ".lora_B.critic." in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    assert all(p.grad is not None for p in pool.value_heads["critic"].parameters())
    assert all(p.grad is None for p in _others(pool, "critic"))
    # the policies still generate with their own adapters: the critic's forward left them intact
    assert pool.activate("actor").active_adapter == "actor"


def test_shared_adapter_critic_owns_only_its_head(tiny_text_model):
    pool = AgentPool([AgentSpec("actor", model=tiny_text_model, lora_r=4)],
                     critics=[CriticSpec("value_a", agent="actor", share_adapter=True)])
    assert [id(p) for p in pool.critic_parameters("value_a")] == [id(p) for p in pool.value_heads["value_a"].parameters()]
    ids, mask = _ids(pool, "actor", ["abc"])
    with torch.no_grad():
        pool.value_heads["value_a"].linear.weight.normal_(0, 0.1)
        for p in pool.policy_parameters("actor"):
            p.normal_(0, 0.1)
    pool.values("value_a", ids, mask).sum().backward()
    assert all(p.grad is not None for p in pool.policy_parameters("actor"))  # the parameter-sharing variant of DC
    groups = pool.trainable_groups()
    assert [(g["kind"], g["name"]) for g in groups] == [("policy", "actor"), ("critic", "value_a")]


def test_select_head_per_row():
    values = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    assert torch.equal(select_head(values, 1), values[..., 1])
    assert torch.equal(select_head(values, torch.tensor([0, 1])), torch.stack([values[0, :, 0], values[1, :, 1]]))
    with pytest.raises(ValueError, match="2 heads"):
        select_head(values, None)


def test_critic_validation_and_save_reload(tiny_text_model, tmp_path):
    with pytest.raises(ValueError, match="not in the team"):
        AgentPool([AgentSpec("actor", model=tiny_text_model)], critics=[CriticSpec("c", agent="zed")])
    with pytest.raises(ValueError, match="already used"):
        AgentPool([AgentSpec("actor", model=tiny_text_model)], critics=[CriticSpec("actor", agent="actor")])
    with pytest.raises(ValueError, match="cannot name a model"):
        CriticSpec("c", agent="actor", share_adapter=True, model="x")
    pool = AgentPool([AgentSpec("actor", model=tiny_text_model, lora_r=4)],
                     critics=[CriticSpec("c", agent="actor", lora_r=4, num_heads=3)])
    with torch.no_grad():
        for p in pool.critic_parameters("c"):
            p.normal_(0, 0.1)
    ids, mask = _ids(pool, "c", ["some text"])
    expected = pool.values("c", ids, mask, head=2)
    pool.save_adapters(tmp_path)
    assert (tmp_path / "adapters" / "c" / "value_head.safetensors").is_file()
    reloaded = AgentPool.from_pretrained(tmp_path)
    assert torch.allclose(reloaded.values("c", ids, mask, head=2), expected)
