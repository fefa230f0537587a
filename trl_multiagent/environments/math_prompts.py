"""The prompt texts of the math environments: first-turn prompts, revision prompts and worked examples.

* The reasoner / Python-tool team (:class:`~trl_multiagent.environments.math_tool.MathToolEnv`, AT-GRPO App. C.2):
  :data:`REASONER_PROMPT` and :data:`TOOL_PROMPT` open an episode (C.2 "Phase 1"); :data:`REASONER_REVISION` and
  :data:`TOOL_REVISION` show each agent both agents' last outputs and answers and their mismatch (C.2 "Phase 2").
  The easy level (:class:`~trl_multiagent.environments.math_tool.MathToolEasyEnv`, issue 18) shows the expected
  format with worked examples: as earlier chat turns (:data:`EASY_EXAMPLES` under :data:`EASY_REASONER_SYSTEM` /
  :data:`EASY_TOOL_SYSTEM`) or inline (:data:`EASY_REASONER_PROMPT`, :data:`EASY_TOOL_PROMPT`).
* The math debate (:class:`~trl_multiagent.environments.debate.MathDebateEnv`, MAPoRL App. G.4-G.5, whose prompt
  text was lost in our copy: these are this project's): :data:`MATH_PROMPT`; its easy level
  (:class:`~trl_multiagent.environments.debate.MathDebateEasyEnv`) :data:`EASY_MATH_SYSTEM` with
  :data:`EASY_DEBATE_EXAMPLES`, or :data:`EASY_MATH_PROMPT` inline. The debate's revision prompt, shared with the
  NLI debate, is :data:`~trl_multiagent.environments.debate.REVISION`.

Templates are ``str.format`` strings (``{question}``; a literal brace doubled).
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------------- reasoner / tool
REASONER_PROMPT = (
    "You are the reasoning agent in a team of two: you solve math problems by step-by-step reasoning, while a tool "
    "agent solves the same problem with Python code. Solve the problem below step by step, then give the final "
    "answer as \\boxed{{answer}} (a number or an expression).\n\nProblem: {question}"
)

TOOL_PROMPT = (
    "You are the Python tool agent in a team of two: you solve math problems by writing code, while a reasoning "
    "agent solves the same problem step by step in words. Write a short Python program that computes the answer to "
    "the problem below and prints ONLY the final answer as its last line (for example `print(answer)`). Use exact "
    "arithmetic (integers or fractions.Fraction) where you can. Reply with the program in a single ```python code "
    "block.\n\nProblem: {question}"
)

#: The easy level's prompts show the expected format with a worked example (issue 18: a 135M model rarely boxes).
EASY_ANSWER_FORMAT = (
    "Write the calculation with the numbers from the problem, then the final answer as \\boxed{{answer}}. Format "
    "example: if a problem asks for 2 more than 5, write: 5 + 2 = 7. The answer is \\boxed{{7}}.\n\nProblem: "
    "{question}"
)

EASY_REASONER_PROMPT = (
    "You are the reasoning agent in a team of two: you solve math problems in words, while a tool agent solves the "
    "same problem with Python code. " + EASY_ANSWER_FORMAT
)

EASY_TOOL_PROMPT = (
    "You are the Python tool agent in a team of two: you solve math problems with Python code, while a reasoning "
    "agent solves the same problem in words. Reply with a short Python program in a single ```python code block "
    "that prints only the answer. Format example: if a problem asks for 2 more than 5, reply:\n```python\n"
    "print(5 + 2)\n```\n\nProblem: {question}"
)

#: Worked examples of the easy level, shown as earlier chat turns (``examples_as_turns``): the request, the
#: reasoner's reply and the tool agent's reply. Their objects (pens, cups) are not among the generator's, so no
#: example is a training or test task.
EASY_EXAMPLES = (
    ("Problem: Sam has 5 pens. Ava gives Sam 2 more. How many pens does Sam have now?",
     "5 + 2 = 7. The answer is \\boxed{7}.", "```python\nprint(5 + 2)\n```"),
    ("Problem: Ben has 3 bags with 4 cups in each bag. How many cups does Ben have in all?",
     "3 * 4 = 12. The answer is \\boxed{12}.", "```python\nprint(3 * 4)\n```"),
)

#: Worked examples with one per operation of the training forms (gain, loss, groups), for
#: ``math_tool_generalisation(worked_examples="each_operation")``: each on arithmetic of the training bucket (5 + 2,
#: 9 - 4, 3 * 5; :func:`~.math_problems.arithmetic_split`, tested), so no prompt shows the arithmetic of a held-out
#: problem (:data:`EASY_EXAMPLES`' 3 * 4 is a held-out key of ``unseen_operands``), and objects the generator never
#: uses (pens, cups), so no example is a task.
EACH_OPERATION_EXAMPLES = (
    EASY_EXAMPLES[0],
    ("Problem: Mia has 9 cups and gives 4 of them to Leo. How many cups does Mia have left?",
     "9 - 4 = 5. The answer is \\boxed{5}.", "```python\nprint(9 - 4)\n```"),
    ("Problem: Ben has 3 bags with 5 cups in each bag. How many cups does Ben have in all?",
     "3 * 5 = 15. The answer is \\boxed{15}.", "```python\nprint(3 * 5)\n```"),
)

#: The instructions (system message) of the easy level's chat prompts; the task follows as ``Problem: {question}``.
EASY_ANSWER_RULE = "Write the calculation with the numbers from the problem, then the final answer as \\boxed{answer}."
EASY_REASONER_SYSTEM = (
    "You are the reasoning agent in a team of two: you solve math problems in words, while a tool agent solves the "
    "same problem with Python code. " + EASY_ANSWER_RULE
)
EASY_TOOL_SYSTEM = (
    "You are the Python tool agent in a team of two: you solve math problems with Python code, while a reasoning "
    "agent solves the same problem in words. Reply with a one-line Python program in a ```python code block that "
    "prints the answer."
)

REASONER_REVISION = """{first_prompt}

Your previous solution:
{solution}

Your previous answer: {answer}

The tool agent's program:
```python
{code}
```
Its output: {output}
Its answer: {other_answer}

{mismatch}
Decide which answer is wrong, then solve the problem again and end with \\boxed{{answer}}."""

TOOL_REVISION = """{first_prompt}

Your previous program:
```python
{code}
```
Its output: {output}
Your previous answer: {answer}

The reasoning agent's solution:
{solution}

Its answer: {other_answer}

{mismatch}
Decide which answer is wrong, then reply with a corrected program in a single ```python code block that \
prints only the final answer."""


# --------------------------------------------------------------------------------------------------- debate
#: The math debate's first-turn prompt (every agent sees the same one).
MATH_PROMPT = (
    "Solve the following math problem. Reason step by step, then write the final answer as \\boxed{{answer}} "
    "(a number).\n\nProblem: {question}"
)

#: The easy level's prompt shows the expected format with a worked example (issue 18: a 135M model rarely boxes).
EASY_MATH_PROMPT = "Solve the math problem. " + EASY_ANSWER_FORMAT
#: The system message of the easy level's chat prompt (``examples_as_turns``).
EASY_MATH_SYSTEM = "Solve the math problem. " + EASY_ANSWER_RULE
#: The worked examples of the easy debate: the reasoner's replies of
#: :data:`EASY_EXAMPLES` ending at the box, because MAPoRL's App. G penalises any token after the box, punctuation
#: included (a first run with the final period: 64% of the answers penalised).
EASY_DEBATE_EXAMPLES = tuple((request, reply.removesuffix(".")) for request, reply, _ in EASY_EXAMPLES)


# --------------------------------------------------------------------------------------------------- split problem
#: The split team (:class:`~trl_multiagent.environments.math_split.MathToolSplitEnv`): the reasoner reads the
#: question with its numbers hidden as A and B and boxes the calculation; the tool agent sees the numbers and the
#: reasoner's plan and prints the value.
SPLIT_REASONER_SYSTEM = (
    "You are the reasoning agent in a team of two. You read a math problem whose two numbers are hidden as A and B; "
    "only the tool agent knows them, and it computes whatever calculation you give. Write the calculation in A and "
    "B that answers the problem, then box it as \\boxed{calculation}."
)
SPLIT_TOOL_SYSTEM = (
    "You are the Python tool agent in a team of two. You know the two numbers A and B of a math problem but not its "
    "question; the reasoning agent reads the question and tells you its plan, a calculation in A and B. Reply with "
    "a short Python program in a ```python code block that sets A and B and prints the value of the plan."
)
#: The tool agent's request: its numbers and the reasoner's plan (``(none yet)`` before the reasoner has answered).
SPLIT_TOOL_REQUEST = "Numbers: A = {A}, B = {B}.\nThe reasoning agent's plan: {plan}"

#: Worked examples of the split team, one per operation of the training forms on training arithmetic (those of
#: :data:`EACH_OPERATION_EXAMPLES`: 5 + 2, 9 - 4, 3 * 5): the reasoner's request and reply, then the tool's.
SPLIT_EXAMPLES = tuple(
    (f"Problem: {hidden}", f"{why}: {plan}. The calculation is \\boxed{{{plan}}}.",
     SPLIT_TOOL_REQUEST.format(A=a, B=b, plan=f"{why}: {plan}. The calculation is \\boxed{{{plan}}}."),
     f"```python\nA = {a}\nB = {b}\nprint({plan})\n```")
    for hidden, why, plan, a, b in (
        ("Sam has A pens. Ava gives Sam B more. How many pens does Sam have now?", "Sam gets B more", "A + B", 5, 2),
        ("Mia has A cups and gives B of them to Leo. How many cups does Mia have left?", "Mia gives B away", "A - B",
         9, 4),
        ("Ben has A bags with B cups in each bag. How many cups does Ben have in all?", "A bags of B cups",
         "A * B", 3, 5),
    ))
