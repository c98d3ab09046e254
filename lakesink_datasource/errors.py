"""The base of every error lakesink raises for a user to act on.

`except LakesinkError` catches them all; each also keeps the builtin base it always had
(`ValueError` for bad input, `RuntimeError` for a state of the world: a catalog that cannot
be reached, a conflict, a refused repair), so `except ValueError` goes on working. The
classes live beside the code that raises them; this module is at the floor of the import
graph so that every layer can use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class LakesinkError(Exception):
    """An error of lakesink's, with a message that says what to do."""


def without_traceback(method: Callable[P, R]) -> Callable[P, R]:
    """Raise a LakesinkError from `method` without the frames inside lakesink.

    Spark hands a Python source's error to the user as its formatted traceback (behind the
    JVM's stack trace on a Spark Connect client), so the message a user acts on ends up under
    a screen of lakesink's internals. A LakesinkError says what to do in its message; its
    frames help nobody, so they are dropped at the entry points Spark calls. Other errors (a
    bug) keep their whole traceback."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except LakesinkError as error:
            raise error.with_traceback(None) from None

    return wrapper
