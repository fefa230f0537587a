"""What every folder shares around the math: loading a user's objects by ``"module:name"`` or file path
(:mod:`.user_code`), files written whole or not at all (:mod:`.atomic_files`), the CPU allocator and gradient blocks
(:mod:`.memory`), threads, progress bars and the cache folder (:mod:`.process`), and a run's provenance: versions,
machine, commit (:mod:`.provenance`).

The bottom floor: it may import :mod:`trl_multiagent.errors` only.
"""
