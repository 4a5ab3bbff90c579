"""Errors the library raises for problems a user can fix.

The command line turns each of these into one line naming the problem and exit
code 2 (``--debug`` shows the traceback). Each subclasses ``ValueError`` so code
that already catches ``ValueError`` keeps working. Kept stdlib-only so that
``hf-clroute --help`` stays fast.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input: a config field, suite file, dataset, split, column or value.

    The message names the file (where there is one), the field and the value.
    """


class NonFiniteTrainingError(UserInputError):
    """A loss or parameter became NaN or infinite during training.

    Raised before anything is written as a finished adapter, so a run never
    leaves an adapter full of NaNs behind.
    """


class ResumeError(UserInputError):
    """A resume that would lose or mix work: no checkpoint, or a changed suite or settings."""


class HubError(UserInputError):
    """A Hub call failed: names the repo and the server, and why (not found, timeout, bad response)."""
