"""Client-selection strategies, one module each, behind the protocol of :mod:`fedjax_sel.base`.

Every module in this package is imported on first use of the registry, so a new strategy only
needs a module with a ``@register_strategy`` factory. A strategy defined elsewhere (a notebook,
a user's module loaded with ``fedjax-sel --plugin MODULE``) registers the same way.
"""

from fedjax_sel.strategies.registry import (
    STRATEGIES,
    make_strategy,
    register_strategy,
)

__all__ = [
    "STRATEGIES",
    "make_strategy",
    "register_strategy",
]
