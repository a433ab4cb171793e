"""Reading pickles from the internet without running them.

``pickle.load`` calls whatever callable a file names (``os.system`` included) while it reads.
FedScale publishes its behaviour traces and device capacities as pickles of plain data (dicts,
lists, numbers, strings), so :func:`load_plain_pickle` admits exactly that: the pickle opcodes
for containers, numbers and strings, plus the few harmless constructors Python itself emits for
plain data (``set``, ``frozenset``, ``complex``, ``bytearray``, ``OrderedDict``, and
``_codecs.encode`` for bytes written by protocol 2). Any other name in the file (a function, a
class, a NumPy array) is refused before anything is called.
"""

from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError

# (module, name) -> the object the unpickler may build plain data with
_PLAIN = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): __import__("codecs").encode,
}


class RefusedPickle(ConfigError):
    """A pickle names something other than plain data; nothing it names was called."""


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedReader, what: str) -> None:
        super().__init__(file)
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        # protocols 0-2 name Python 2's module (pickle writes them so by default)
        module = {"__builtin__": "builtins"}.get(module, module)
        try:
            return _PLAIN[(module, name)]
        except KeyError:
            raise RefusedPickle(
                f"{self.what} names {module}.{name}: only plain data (dicts, lists, numbers, "
                "strings) is read from a pickle, and nothing it names is run; convert the file "
                "to JSON of the same shape"
            ) from None


def load_plain_pickle(path: str | Path, what: str = "pickle file") -> Any:
    """The plain data of the pickle at ``path`` (``what`` names it in errors); a
    :class:`RefusedPickle` (a :class:`ConfigError`) for a file that names anything else."""
    path = Path(path)
    with path.open("rb") as f:
        return _PlainUnpickler(f, f"{what} {str(path)!r}").load()
