"""What sharing the prompts' opening saves in the teacher-forced passes of a MAPoRL debate batch: the policy's
log-probs and the critic's values with :func:`~trl_multiagent.generation.teacher_forcing.completion_outputs` sharing prompts
and prefixes, against one plain pass per row, in the same run.

    python benchmarks/teacher_forcing.py [--out experiments/speed/teacher_forcing/teacher_forcing.json]

The batch is one agent's micro-batch of the MAPoRL easy-math recipe (``recipes/configs/math_easy_debate.yaml``):
8 rows, the 4 turn-1 prompts of 4 training problems of ``math_debate_easy`` (system message and worked examples as
chat turns) and the 4 turn-2 prompts that show both debaters' answers, each with a 30-token completion. The model is
the embedded SmolLM2-135M-Instruct in float32 with a LoRA policy (r 16) and a value-head critic on its own adapter,
as in the recipe. Timed, alternating shared and plain (``--repeats`` blocks each, the median reported): the policy's
log-probs without gradients (a rollout's behaviour log-probs), and the policy loss's and the value loss's forward
and backward (a PPO epoch). The two paths' log-probs and values are compared as a check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from measure import write_result

from trl_multiagent.environments.debate import MathDebateEasyEnv
from trl_multiagent.generation.logprobs import completion_logps
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentPool, AgentSpec

# 30 tokens-ish answers, as the debaters write them (a short sentence and a box)
ANSWERS = ["Tom has 3 apples and gets 4 more, so he has 3 + 4 = 7 apples. \\boxed{7}",
           "There are 5 bags with 2 apples in each bag, so 5 x 2 = 10. \\boxed{10}",
           "She gives 2 of the 7 pears away, so 7 - 2 = 5 are left. \\boxed{5}",
           "Together they have 6 + 3 = 9 marbles in all. \\boxed{9}"]


def debate_batch(pool: AgentPool, agent: str):
    env = MathDebateEasyEnv(num_agents=2, max_turns=2, early_stop=False)
    tasks = env.make_dataset(num_tasks=4, seed=0, split="train")
    prompts, completions = [], []
    for i, task in enumerate(tasks):
        first = env.reset(task)
        prompts.append(first[agent])
        completions.append(ANSWERS[i])
        second = env.step({a: ANSWERS[(i + j) % 4] for j, a in enumerate(env.agents)}).next_prompts
        prompts.append(second[agent])
        completions.append(ANSWERS[(i + 1) % 4])
    tok = pool.tokenizer_of(agent)
    enc = [pool.encode_prompt(agent, p) for p in prompts]
    comp = [tok(c, add_special_tokens=False)["input_ids"][:30] for c in completions]
    width, t = max(map(len, enc)), max(map(len, comp))
    pad = tok.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc])
    prompt_mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    completion_ids = torch.tensor([c + [pad] * (t - len(c)) for c in comp])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (t - len(c)) for c in comp])
    return prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/teacher_forcing.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    pool = AgentPool([AgentSpec("agent1", model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)],
                     critics=[CriticSpec("agent1_critic", agent="agent1", lora_r=16, lora_alpha=32)])
    with torch.no_grad():
        pool.value_heads["agent1_critic"].linear.weight.normal_(0, 0.01)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = debate_batch(pool, "agent1")
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    policy = lambda **inputs: pool("agent1", **inputs)  # noqa: E731

    def behaviour(share):
        with torch.no_grad():
            return completion_logps(policy, *batch, 0.7, share_prompts=share)[0]

    def policy_step(share):
        pool.zero_grad()
        logps, _ = completion_logps(policy, *batch, 0.7, share_prompts=share)
        (logps * completion_mask).sum().backward()
        return logps.detach()

    def value_step(share):
        pool.zero_grad()
        values = pool.completion_values("agent1_critic", *batch, share_prompts=share)
        (values.pow(2) * completion_mask).sum().backward()
        return values.detach()

    mask = completion_mask.bool()
    rows = {}
    for name, fn in (("behaviour_logps", behaviour), ("policy_forward_backward", policy_step),
                     ("value_forward_backward", value_step)):
        times = {True: [], False: []}
        outputs = {}
        fn(True)  # warm-up
        for _ in range(args.repeats):
            for share in (True, False):
                start = time.perf_counter()
                outputs[share] = fn(share)
                times[share].append(time.perf_counter() - start)
        shared, plain = statistics.median(times[True]), statistics.median(times[False])
        rows[name] = {"shared_s": round(shared, 3), "plain_s": round(plain, 3),
                      "shared_over_plain": round(shared / plain, 3),
                      "max_abs_difference": float((outputs[True] - outputs[False])[mask].abs().max())}
        print(f"{name}: shared {shared:.3f} s, plain {plain:.3f} s, ratio {shared / plain:.3f}, max |diff| "
              f"{rows[name]['max_abs_difference']:.2e}", file=sys.stderr)
    prompt_tokens = sum(map(len, enc))
    opening = min(len(enc[0]), *(next((i for i, (a, b) in enumerate(zip(enc[0], e)) if a != b), len(e))
                                 for e in enc[1:]))
    result = {"rows": len(enc), "prompt_tokens": prompt_tokens, "completion_tokens": sum(map(len, comp)),
              "shared_opening_tokens": opening, "threads": torch.get_num_threads(), "repeats": args.repeats,
              "timings": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
