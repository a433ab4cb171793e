"""The paper studies behind ``fedjax-sel reproduce NAME``: one module per paper, each a
:class:`~fedjax_sel.experiment.study.Study` of the paper's settings that registers itself with
:func:`~fedjax_sel.experiment.reproductions.register_reproduction`.

They live outside the library: ``fedjax_sel`` never imports them by name. ``pip install -e .``
installs this package beside it and names it in the ``fedjax_sel.studies`` entry-point group
(``pyproject.toml``), which the registry of reproductions imports the first time it is read;
``fedjax-sel --plugin studies`` imports it where it is not installed (run from the folder that
holds it). Importing the package imports every public module in it, so a new study is a new
module here.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
