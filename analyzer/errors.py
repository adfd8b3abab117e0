"""The one error type a user sees: a single line naming the file, the key or the value. Exit status 2."""


class UsageError(Exception):
    exit_code = 2
