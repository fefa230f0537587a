"""The command line and what it reads: ``trl-multiagent train | evaluate | train-single | train-verifier | push``
(:mod:`.cli`), the recipe schema (:mod:`.recipe`, its fields :mod:`.recipe_fields`, its files :mod:`.recipe_files`,
TRL's names for them :mod:`.trl_names`), data files (:mod:`.datafiles`), the runner that turns a recipe into a trained
and evaluated team (:mod:`.runner`), a saved team loaded back (:mod:`.saved_team`, ``trl_multiagent.Team``), warm
starts from saved adapters (:mod:`.warm_start`), the commands beside training (:mod:`.evaluate`,
:mod:`.train_single`, :mod:`.train_verifier` with its recipe :mod:`.verifier_recipe`, :mod:`.hub`).

The top floor: it may import every other folder; nothing below imports it. Importing :mod:`.cli` imports no torch,
so that ``--help`` and a bad recipe answer at once.
"""
