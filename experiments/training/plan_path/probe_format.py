"""How often the embedded model's plan agent writes a parsable ``ACTIONS:`` line (the numbers in README.md).

    python experiments/training/plan_path/probe_format.py                 # 5x5-8x8 maps, plain prompt
    python experiments/training/plan_path/probe_format.py --prefill --sizes 3,4   # answer prefilled with "ACTIONS:"
"""

import argparse

import torch
from transformers import AutoModelForCausalLM

from trl_multiagent.environments.games.plan_path import PlanPathEnv
from trl_multiagent.models.loading import load_tokenizer, resolve_model

parser = argparse.ArgumentParser()
parser.add_argument("--prefill", action="store_true")
parser.add_argument("--sizes", default="5,6,7,8")
parser.add_argument("--maps", type=int, default=6)
parser.add_argument("--samples", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
path = resolve_model("smollm2-135m-instruct")
tok = load_tokenizer(path)
tok.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
rows = PlanPathEnv.make_dataset(num_tasks=args.maps, seed=0, split="train",
                                sizes=tuple(int(s) for s in args.sizes.split(",")))
env = PlanPathEnv(max_turns=2)
prefix = "ACTIONS:" if args.prefill else ""
texts = [tok.apply_chat_template([{"role": "user", "content": env.reset(row)["plan"]}], add_generation_prompt=True,
                                 tokenize=False) + prefix for row in rows]
batch = tok(texts, return_tensors="pt", padding=True)
with torch.no_grad():
    out = model.generate(**batch, max_new_tokens=96, do_sample=True, temperature=1.0,
                         num_return_sequences=args.samples, pad_token_id=tok.pad_token_id)
answers = tok.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
parsed = reached = 0
for i, answer in enumerate(answers):
    env.reset(rows[i // args.samples])
    moves = env.parse(prefix + answer, from_stdout=False)
    parsed += moves is not None
    reached += moves is not None and env.simulate(moves).reached
print(f"parsed {parsed} of {len(answers)}, reached the goal {reached}")
