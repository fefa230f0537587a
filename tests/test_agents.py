"""AgentPool: shared bases, one adapter per policy, gradient isolation, save/load (tiny models built here)."""

import pytest
import torch
from transformers import GenerationConfig

from tests.numerics import assert_same_greedy
from tests.tiny import model_terms, save_tiny
from trl_multiagent.team.pool import AgentPool, AgentSpec, check_team


def _lora(pool, policy, which="lora_B"):
    names = {id(p): n for n, p in pool.named_parameters()}
    return [p for p in pool.policy_parameters(policy) if which in names[id(p)]]


def _loss(pool, policy, text="hello world"):
    tok = pool.tokenizer_of(policy)
    ids = torch.tensor([tok(text)["input_ids"]])
    return pool(policy, input_ids=ids, labels=ids).loss


def _make_b_nonzero(pool):
    # LoRA starts with B = 0; give every adapter some B so gradients reach both of its matrices
    with torch.no_grad():
        for policy in pool.policies:
            for p in _lora(pool, policy):
                p.normal_(0, 0.1)


@pytest.fixture(scope="module")
def second_tiny_model(tmp_path_factory):
    chars = list("abcdefghijklmnopqrstuvwxyz ")
    return save_tiny(tmp_path_factory.mktemp("tiny_other"), chars=chars, seed=1, hidden=16)


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _assert_only_policy_changes(pool, trained, frozen_policies):
    base_params = [p for n, p in pool.named_parameters() if "lora_" not in n]
    before_base = _snapshot(base_params)
    before_frozen = {q: _snapshot(pool.policy_parameters(q)) for q in frozen_policies}
    before_trained = _snapshot(pool.policy_parameters(trained))
    groups = [{"params": pool.policy_parameters(q), "lr": 0.05} for q in pool.policies]
    opt = torch.optim.AdamW(groups, weight_decay=0.1)
    opt.zero_grad()
    _loss(pool, trained).backward()
    # gradients exist for the trained adapter only; never for the base or another adapter
    assert all(p.grad is not None for p in pool.policy_parameters(trained))
    assert any(p.grad.abs().sum() > 0 for p in pool.policy_parameters(trained))
    for q in frozen_policies:
        assert all(p.grad is None for p in pool.policy_parameters(q))
    assert all(p.grad is None for p in base_params)
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before_trained, pool.policy_parameters(trained)))
    for q in frozen_policies:
        assert all(torch.equal(a, b) for a, b in zip(before_frozen[q], pool.policy_parameters(q)))
    assert all(torch.equal(a, b) for a, b in zip(before_base, base_params))


def test_shared_base_one_copy_and_gradient_isolation(tiny_text_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4),
                      AgentSpec("main", model=tiny_text_model, lora_r=4)])
    assert len(pool.bases) == 1  # ONE base shared by both policies
    assert set(pool.base_of("aux").peft_config) == {"aux", "main"}
    _make_b_nonzero(pool)
    _assert_only_policy_changes(pool, "aux", ["main"])
    _assert_only_policy_changes(pool, "main", ["aux"])


def test_separate_bases_gradient_isolation_and_own_tokenizers(tiny_text_model, second_tiny_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4),
                      AgentSpec("main", model=second_tiny_model, lora_r=4)])
    assert len(pool.bases) == 2
    assert len(pool.tokenizer_of("aux")) != len(pool.tokenizer_of("main"))
    _make_b_nonzero(pool)
    _assert_only_policy_changes(pool, "main", ["aux"])
    gen = GenerationConfig(max_new_tokens=3, do_sample=True)
    out = pool.generate("main", ["abc", "de"], num_samples=2, generation_config=gen)
    assert [len(g) for g in out] == [2, 2]
    assert all(t < len(pool.tokenizer_of("main")) for g in out for s in g for t in s.completion_ids)


def test_shared_policy_is_one_adapter(tiny_text_model):
    pool = AgentPool([AgentSpec("a", model=tiny_text_model, policy="shared", lora_r=4),
                      AgentSpec("b", model=tiny_text_model, policy="shared", lora_r=4)])
    assert list(pool.policies) == ["shared"] and pool.policies["shared"].agents == ["a", "b"]
    assert pool.policy_of("a") == pool.policy_of("b") == "shared"


def test_team_validation_errors_before_loading():
    with pytest.raises(ValueError, match="unique"):
        check_team([AgentSpec("ann"), AgentSpec("ann")])
    with pytest.raises(ValueError, match="share policy"):
        check_team([AgentSpec("ann", policy="p", lora_r=4), AgentSpec("bob", policy="p", lora_r=8)])
    with pytest.raises(ValueError, match="quantization"):
        AgentSpec("ann", quantization="3bit")
    with pytest.raises(ValueError, match="Agent name"):
        AgentSpec("bad name")


def test_save_and_reload_adapters(tiny_text_model, tmp_path):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4),
                      AgentSpec("main", model=tiny_text_model, lora_r=4, learning_rate=1e-3)])
    _make_b_nonzero(pool)
    pool.save_adapters(tmp_path)
    assert (tmp_path / "adapters" / "aux" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "adapters" / "main" / "adapter_config.json").is_file()
    again = AgentPool.from_pretrained(tmp_path)
    assert again.specs["main"].learning_rate == 1e-3
    for policy in ("aux", "main"):
        for a, b in zip(pool.policy_parameters(policy), again.policy_parameters(policy)):
            assert torch.equal(a, b)
    # the two policies were saved apart, not as copies of each other
    assert not torch.equal(_lora(again, "aux")[0], _lora(again, "main")[0])


def test_qlora_shared_4bit_base(tiny_text_model):
    import bitsandbytes as bnb
    pool = AgentPool([AgentSpec(f"agent{i}", model=tiny_text_model, quantization="4bit", lora_r=4) for i in range(3)])
    assert len(pool.bases) == 1
    n4 = sum(isinstance(m, bnb.nn.Linear4bit) for m in pool.modules())
    single = AgentPool([AgentSpec("solo", model=tiny_text_model, quantization="4bit", lora_r=4)])
    assert n4 == sum(isinstance(m, bnb.nn.Linear4bit) for m in single.modules()) > 0
    _make_b_nonzero(pool)
    _assert_only_policy_changes(pool, "agent1", ["agent0", "agent2"])


@pytest.mark.parametrize("targets", [["q_proj", "lm_head"], ".*(q_proj|lm_head)", ["model.lm_head"]])
def test_lora_on_the_output_layer_is_refused_before_loading(targets):
    with pytest.raises(ValueError, match=r"output layer '(model\.)?lm_head'.*never be trained"):
        AgentSpec("ann", model="/nonexistent/model", lora_target_modules=targets)
    from trl_multiagent.team.critics import CriticSpec

    with pytest.raises(ValueError, match="output layer"):
        CriticSpec("critic", agent="ann", lora_target_modules=targets)


def test_an_adapted_output_layer_that_slips_past_the_names_is_refused_after_loading(tiny_ab_model, monkeypatch):
    import trl_multiagent.team.agent_spec as agent_spec_module

    monkeypatch.setattr(agent_spec_module, "check_lora_targets", lambda owner, targets: None)
    spec = AgentSpec("ann", model=tiny_ab_model, lora_target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match="LoRA on the output layer"):
        AgentPool([spec])


def test_policy_names_inside_peft_prefix_are_refused():
    with pytest.raises(ValueError, match="prefix 'lora_'"):
        AgentSpec("a")
    assert AgentSpec("a", policy="shared").policy == "shared"


def test_generate_many_answers_every_request_in_order(tiny_text_model, second_tiny_model):
    from trl_multiagent.team.pool import GenerationRequest

    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4),
                      AgentSpec("main", model=tiny_text_model, lora_r=4),
                      AgentSpec("other", model=second_tiny_model, lora_r=4)])
    _make_b_nonzero(pool)
    greedy = GenerationConfig(max_new_tokens=4, do_sample=False)
    requests = [GenerationRequest("main", "abc"), GenerationRequest("aux", "abc", num_samples=2),
                GenerationRequest("main", "abc", use_adapter=False), GenerationRequest("other", "de"),
                GenerationRequest("aux", "xyz")]
    out = pool.generate_many(requests, greedy)
    assert [len(g) for g in out] == [1, 2, 1, 1, 1]
    # each answer is what the agent alone gives for that prompt: its adapter on, or off for use_adapter=False (a
    # batch of another shape: equal up to a rounding tie, tests/numerics.py)

    def same(got, agent, prompt, use_adapter=True):
        ids = pool.encode_prompt(agent, prompt)

        def logits_after(prefix):
            with torch.no_grad():
                if use_adapter:
                    return pool(pool.policy_of(agent), input_ids=torch.tensor([ids + prefix])).logits[0, -1]
                with pool.reference(agent) as ref:
                    return ref(input_ids=torch.tensor([ids + prefix])).logits[0, -1]

        if use_adapter:
            alone = pool.generate(agent, [prompt], 1, greedy)[0][0].completion_ids
        else:
            with pool.reference(agent):
                alone = pool.generate(agent, [prompt], 1, greedy)[0][0].completion_ids
        assert_same_greedy(got, alone, logits_after, terms=model_terms(len(ids) + 4), what=f"{agent} {prompt!r}")
        return alone

    same(out[0][0].completion_ids, "main", "abc")
    same(out[1][1].completion_ids, "aux", "abc")
    same(out[4][0].completion_ids, "aux", "xyz")
    same(out[3][0].completion_ids, "other", "de")
    base_answer = same(out[2][0].completion_ids, "main", "abc", use_adapter=False)
    assert base_answer != out[0][0].completion_ids  # the adapter changes the answer
