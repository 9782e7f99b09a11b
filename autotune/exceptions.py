"""The one error class of autotune, and how its messages quote what the user gave."""


class AutotuneError(Exception):
    """Raised for bad input or an impossible request.

    The message names what went wrong, the offending value and the fix. The CLI prints it as one
    line and exits with code 2; library callers catch it like any other exception.
    """


def shorten(value: object, limit: int = 60) -> str:
    """`repr(value)` for an error message, cut in the middle when longer than `limit` characters
    (the length given is the string's own).

    Example:
        >>> shorten("tp=1," * 1000, limit=20)
        "'tp=1,tp=…=1,tp=1,' (5,000 characters)"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    half = max(1, (limit - 1) // 2)
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[:half]}…{text[-half:]} ({length:,} characters)"
