"""The code a run was made by, so that a finished run or a checkpoint made by other code is
recomputed, not mixed with this code's runs.

The record is a digest of the package's source (the bytes of every ``.py`` file under
``fedjax_sel/`` with its path: any edit counts, a comment's included; parsing the files to
ignore comments would cost a second per process) and the package version. It goes into every
run's ``config.json`` and a reproduction's ``run_info.json`` and ``per_seed.json``;
:func:`same_code` is what the experiment layer checks before it reuses a finished cell or
resumes a checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any


def source_digest_of(root: str | Path) -> str:
    """Hex digest (16 characters) of every ``.py`` file under ``root``, path and bytes."""
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


@functools.cache
def source_digest() -> str:
    """:func:`source_digest_of` the imported ``fedjax_sel`` package (computed once)."""
    import fedjax_sel

    return source_digest_of(Path(fedjax_sel.__file__).parent)


def code_record() -> dict[str, str]:
    """What is recorded with a run: the package version and :func:`source_digest`."""
    import fedjax_sel

    return {"fedjax_sel": fedjax_sel.__version__, "source": source_digest()}


def same_code(stored: Any) -> bool:
    """Whether a stored :func:`code_record` is this code's (a run without one is not)."""
    return isinstance(stored, dict) and stored.get("source") == source_digest()
