"""Jobs written as coroutines, which queickd does not await (yet)."""


async def aadd(a, b):
    return a + b


def returns_a_coroutine(a, b):
    """A plain def whose call returns an awaitable: only its run can tell."""
    return aadd(a, b)
