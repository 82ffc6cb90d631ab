"""Errors of the compare tool."""


class BadInput(Exception):
    """Input that cannot be compared: missing path, not a GGUF, truncated file, bad tolerance file.

    The CLI prints the message as one line and exits 2.
    """
