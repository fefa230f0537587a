"""utils.gradients_in_one_block: each policy's gradients as views of one buffer, allocated before its backward pass
(so that a team's scattered first gradients do not pin freed activations in glibc's heap), with the gradients
themselves unchanged."""

from __future__ import annotations

import torch

from trl_multiagent.runtime.memory import gradients_in_one_block


def test_missing_gradients_become_zero_views_of_one_block_per_dtype():
    a = torch.nn.Parameter(torch.ones(2, 3))
    b = torch.nn.Parameter(torch.ones(4))
    c = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    kept = torch.nn.Parameter(torch.ones(2))
    kept.grad = torch.full((2,), 7.0)
    frozen = torch.nn.Parameter(torch.ones(5), requires_grad=False)
    assert gradients_in_one_block([a, b, c, kept, frozen]) == 3
    assert a.grad.untyped_storage().data_ptr() == b.grad.untyped_storage().data_ptr()  # one float32 block
    assert a.grad.untyped_storage().nbytes() == (6 + 4) * 4
    assert c.grad.untyped_storage().data_ptr() != a.grad.untyped_storage().data_ptr()  # float64: its own block
    assert a.grad.shape == (2, 3) and b.grad.shape == (4,) and c.grad.dtype == torch.float64
    assert all(float(p.grad.abs().sum()) == 0.0 for p in (a, b, c))
    assert kept.grad.tolist() == [7.0, 7.0] and frozen.grad is None
    assert gradients_in_one_block([a, b, c]) == 0  # nothing missing: nothing made


def test_backward_adds_into_the_block_in_place():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    w = torch.nn.Parameter(torch.zeros(3))
    v = torch.nn.Parameter(torch.tensor(2.0))
    gradients_in_one_block([w, v])
    block = w.grad.untyped_storage().data_ptr()
    ((x @ w) * v).sum().backward()  # d/dw = v * (column sums of x), d/dv = sum(x @ w) = 0
    ((x @ w) * v).sum().backward()  # accumulated: twice that
    assert w.grad.tolist() == [20.0, 28.0, 36.0] and v.grad.item() == 0.0
    assert w.grad.untyped_storage().data_ptr() == block == v.grad.untyped_storage().data_ptr()


def test_a_team_update_gives_each_policy_one_block_and_the_same_gradients(tiny_text_model, tmp_path, monkeypatch):
    from datasets import Dataset

    import trl_multiagent.trainers.base as trainer_base
    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.rollout import Experience, Sample
    from trl_multiagent.team.pool import AgentSpec, Generation
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    names = ["first", "second"]
    grads, storages = {}, {}
    for blocks in (True, False):
        if not blocks:
            monkeypatch.setattr(trainer_base, "gradients_in_one_block", lambda params: 0)
        env = lambda: FunctionEnvironment(names, {a: (lambda t: t["prompt"]) for a in names},  # noqa: E731
                                          lambda completions, **_: 0.0)
        args = MAGRPOConfig(output_dir=str(tmp_path / str(blocks)), report_to=[], max_completion_length=4,
                                    num_generations=2, save_strategy="no", disable_tqdm=True, model_dtype="float64",
                                    per_device_train_batch_size=2)
        trainer = MAGRPOTrainer([AgentSpec(a, model=tiny_text_model, lora_r=4, lora_alpha=8) for a in names],
                                        env, args, Dataset.from_dict({"prompt": ["ab"] * 2}))
        torch.manual_seed(0)
        with torch.no_grad():
            for n, p in trainer.pool.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.3)
        samples = []
        for i, (agent, text, completion, advantage) in enumerate([
                ("first", "one plus one", "two", 1.0), ("first", "two plus two", "four", -1.0),
                ("first", "six minus one", "five", 0.5), ("second", "one plus one", "2", -0.5),
                ("second", "three", "3", 1.0)]):
            prompt = trainer.pool.encode_prompt(agent, "answer in one word. " + text)
            ids = trainer.pool.tokenizer_of(agent)(completion, add_special_tokens=False)["input_ids"]
            samples.append(Sample(agent=agent, policy=agent, episode=i, turn=0, node=i, joint_ids=[],
                                  generation=Generation(list(prompt), ids, completion), advantage=advantage))
        trainer.pool.train()
        trainer.pool.zero_grad()
        trainer.update(trainer.pool, Experience(samples, [], {}))
        grads[blocks] = {a: [p.grad.clone() for p in trainer.pool.policy_parameters(a)] for a in names}
        storages[blocks] = {a: {p.grad.untyped_storage().data_ptr() for p in trainer.pool.policy_parameters(a)}
                            for a in names}
    # with blocks: one storage per policy ("first"'s two micro-batches added into it), a different one per policy
    assert all(len(s) == 1 for s in storages[True].values())
    assert storages[True]["first"] != storages[True]["second"]
    # without: a storage per parameter
    assert all(len(s) == len(grads[False][a]) for a, s in storages[False].items())
    # the same gradients, bit for bit (zero plus the first gradient is that gradient; the rest add in the same order)
    for a in names:
        assert all(torch.equal(x, y) for x, y in zip(grads[True][a], grads[False][a], strict=True))
        assert any(float(g.abs().sum()) > 0 for g in grads[True][a])
