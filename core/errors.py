"""The one exception type for input a user can fix.

core raises InputError, with a message a learner can act on ("d_model=10 is not divisible by
n_heads=4"), for every request it cannot carry out because of its input: a size, a token id, a
position, a choice, a checkpoint folder. It is a ValueError, so plain Python callers may catch
that. The app answers InputError, and only InputError, with 422: any other exception, a
ValueError from NumPy included, is a bug and becomes a logged 500.
"""


class InputError(ValueError):
    """What is wrong with the input, and what to change."""
