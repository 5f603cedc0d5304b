"""Errors raised by the credit-assignment stack.

`CreditError` is a user-facing mistake (bad mode name, missing plugin, wrong plugin output shape): callers
report its message as one line and exit with code 2. It is a `ValueError` so plain Python callers can catch it
the usual way.
"""


class CreditError(ValueError):
    """A credit configuration or plugin problem the user can fix."""
