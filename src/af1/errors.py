"""The one exception type the CLI turns into a one-line message and exit code 2."""


class Af1Error(Exception):
    """A problem with the user's input or environment, stated in one line."""
