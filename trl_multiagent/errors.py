"""The error of a recipe that cannot be run as written (one clean line and exit code 2 on the command line)."""


class RecipeError(ValueError):
    """A recipe (YAML file or command line) that cannot be run as written."""
