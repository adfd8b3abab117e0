"""The one error the trace loader raises for a bad input file."""


class TraceError(Exception):
    """A file that cannot be read as a Kineto trace; the message is one line naming the file."""
