"""The base models: loading a base by name or path (:mod:`.loading`: dtypes, 4-bit, the embedded default), the embedded
default model converted from its GGUF file (:mod:`.embedded`), and the grouped attention that lets one forward pass
share a prompt's opening among its completions (:mod:`.grouped_attention`).

May import: :mod:`trl_multiagent.errors`, :mod:`trl_multiagent.runtime`. Importing this folder imports no torch: the
recipe checks read :data:`QUANTIZATIONS` from here before any model loads.
"""

#: The quantizations an agent's base model may have: none (full precision) or 4-bit (QLoRA).
QUANTIZATIONS = (None, "4bit")
