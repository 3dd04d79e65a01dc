"""The one exception type for user mistakes.

    >>> from trainsim.errors import UserError
    >>> raise UserError("trace.json: no 'traceEvents' key; expected a Kineto trace")  # doctest: +SKIP

Anything the user can cause (a bad file, a bad flag value, an impossible configuration) raises
``UserError`` with a one-line message that names the file, field or value and what was expected.
The CLI turns it into that line on stderr and exit code 2. Internal invariants use ``assert``.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input; the message is shown as is, on one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
