"""MAPoRL's learned verifier (Sec. 3.2; App. B): a value head on a base model that scores a solution's chance of being
right, the solutions it is trained on, and its training loop (:mod:`.learned`). Its recipe and the
``train-verifier`` command live in :mod:`trl_multiagent.command` (``verifier_recipe``, ``train_verifier``).

May import: :mod:`trl_multiagent.team`, :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.environments`,
:mod:`trl_multiagent.runtime`, :mod:`trl_multiagent.errors`.
"""
