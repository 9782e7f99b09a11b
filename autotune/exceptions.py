"""The one error class of autotune."""


class AutotuneError(Exception):
    """Raised for bad input or an impossible request.

    The message names what went wrong, the offending value and the fix. The CLI prints it as one
    line and exits with code 2; library callers catch it like any other exception.
    """
