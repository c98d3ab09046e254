"""The base of every error lakesink raises for a user to act on.

`except LakesinkError` catches them all; each also keeps the builtin base it always had
(`ValueError` for bad input, `RuntimeError` for a state of the world: a catalog that cannot
be reached, a conflict, a refused repair), so `except ValueError` goes on working. The
classes live beside the code that raises them; this module is at the floor of the import
graph so that every layer can use it.
"""

from __future__ import annotations


class LakesinkError(Exception):
    """An error of lakesink's, with a message that says what to do."""
