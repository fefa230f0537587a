"""How often the untrained embedded model answers the easy arithmetic tasks right, per prompt style (issue 18).

For each agent prompt of the easy math environments (AT-GRPO's reasoner and tool agent, MAPoRL's debater) and each
prompt style (``examples_as_turns`` True: two worked examples as earlier chat turns; False: one format example
inside the user message), the first-turn replies of SmolLM2-135M-Instruct on the first TRAINING-split problems
(never the test split), greedy and sampled, scored as the environments score them: the reasoner and the debater by
their final answer (the last box, else the last number), the tool agent by its program's printed line (run in the
project's sandbox, as the environment runs it). For the debater also the share of replies with text after the box
(MAPoRL's App. G post-box penalty).

    python experiments/training/math_easy_prompts/measure_prompts.py --out experiments/training/math_easy_prompts/prompts.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_multiagent.credit.maporl import PenaltySettings, answer_penalties
from trl_multiagent.environments.debate import MathDebateEasyEnv
from trl_multiagent.environments.math_tool import MathToolEasyEnv
from trl_multiagent.metrics.answers import answers_match, final_answer, last_boxed
from trl_multiagent.models.embedded import ensure_embedded_checkpoint

#: Only App. G's post-box check (the debate recipe's other penalties are not about the prompt).
POST_BOX = PenaltySettings(no_boxed=False, no_eos=False, min_tokens=0, repetition=False, post_boxed=True)


def replies(model, tok, prompts, max_new_tokens, temperature, repeats, seed):
    texts = [tok.apply_chat_template(p if isinstance(p, list) else [{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True) for p in prompts] * repeats
    enc = tok(texts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    kwargs = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                            "top_p": 1.0, "top_k": 0}
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **kwargs)
    return tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)


def score(agent, rows, texts, style):
    """(fraction in the expected format, fraction right, fraction with text after the box), as the environment scores
    a first-turn reply; the last counts the replies MAPoRL's App. G post-box penalty hits (debater only)."""
    fmt = right = post_box = 0
    for row, text in zip(rows, texts):
        if agent == "debater":
            env = MathDebateEasyEnv(num_agents=2, max_turns=1, examples_as_turns=style)
            env.reset(row)
            answer = env.extract_answer(text)
            fmt += "\\boxed" in text
            right += answer is not None and env.same_answer(answer, row["answer"])
            post_box += answer_penalties(text, [], False, POST_BOX)["post_boxed"]
            continue
        env = MathToolEasyEnv(max_turns=1, examples_as_turns=style)
        env.reset(row)
        if agent == "reasoner":  # the environment's reading of a reply, without running an empty program
            answer = final_answer(text, env.accept_final_number)
            fmt += last_boxed(text) is not None
            right += answer is not None and answers_match(answer, row["answer"])
            continue
        info = env.step({"tool": text, "reasoner": ""}).info  # runs the program in the sandbox
        fmt += info["tool_executes"]
        right += info["tool_correct"]
    return fmt / len(texts), right / len(texts), post_box / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_problems", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2, help="samples per problem at each temperature above 0")
    parser.add_argument("--max_new_tokens", type=int, default=40)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = ensure_embedded_checkpoint("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = list(MathToolEasyEnv.make_dataset(args.num_problems, seed=0, split="train"))
    results = []
    for agent in ("reasoner", "tool", "debater"):
        for style in (False, True):
            if agent == "debater":
                env = MathDebateEasyEnv(num_agents=2, max_turns=1, examples_as_turns=style)
                prompts = [env.reset(r)["agent1"] for r in rows]
            else:
                env = MathToolEasyEnv(max_turns=1, examples_as_turns=style)
                prompts = [env.reset(r)[agent] for r in rows]
            for temperature in args.temperatures:
                repeats = 1 if temperature == 0 else args.repeats
                start = time.time()
                texts = replies(model, tok, prompts, args.max_new_tokens, temperature, repeats, seed=0)
                fmt, right, post_box = score(agent, rows * repeats, texts, style)
                results.append({"agent": agent, "examples_as_turns": style, "temperature": temperature,
                                "replies": len(texts), "format": round(fmt, 3), "right": round(right, 3),
                                "text_after_box": round(post_box, 3), "example_reply": texts[0]})
                print(f"{agent:9s} examples_as_turns={style!s:5s} T={temperature}: format {fmt:.3f} right "
                      f"{right:.3f} text after the box {post_box:.3f} ({len(texts)} replies, "
                      f"{time.time() - start:.0f} s)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": "smollm2-135m-instruct", "split": "train", "num_problems": args.num_problems,
                   "max_new_tokens": args.max_new_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
