"""finecap's packaged recipes: YAML files shipped inside the package (``demo/*.yaml``: the embedded world;
``coco/*.yaml``: the papers' settings), found by name wherever finecap is installed.

``finecap train demo/smile`` (or just ``smile`` when the name is unambiguous) runs a packaged recipe; a path to a YAML
file that exists always wins. ``finecap recipes`` lists them with their one-line descriptions (each recipe's first
comment line); ``finecap recipes cp demo/smile my_smile.yaml`` copies one to start a configuration of your own.

Example::

    >>> "demo/mle" in list_recipes()
    True
    >>> resolve_recipe("smile").name
    'smile.yaml'
"""

from __future__ import annotations

import difflib
import os
from importlib.resources import as_file, files
from pathlib import Path


def _root() -> Path:
    with as_file(files(__name__)) as root:  # a real folder for a normal (wheel or editable) install
        return Path(root)


def list_recipes() -> list[str]:
    """Names of the packaged recipes (``group/name``, sorted)."""
    root = _root()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def describe_recipe(name: str) -> str:
    """The first comment line of a recipe: one whole sentence saying what it runs, without the ``#``."""
    for line in resolve_recipe(name).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_recipe(name_or_path: str | Path) -> Path:
    """A YAML file that exists, else a packaged recipe by name (``demo/smile``, ``demo/smile.yaml``, or ``smile``
    when only one group has it); an unknown name raises ``ValueError`` listing the recipes.

    A packaged recipe's name cannot be shadowed by a folder of the same name in the working directory (the run
    folder of ``finecap demo --out demo`` holds ``demo/mle/``): a folder is never a recipe, and an existing file
    without a ``.yaml`` / ``.yml`` suffix is taken only when no packaged recipe has that name. A path that exists but
    is no regular file (a FIFO, a device) is refused as such, never said to be missing."""
    path = Path(name_or_path)
    name = str(name_or_path).removesuffix(".yaml").removesuffix(".yml")
    names = list_recipes()
    matches = [n for n in names if n == name] or [n for n in names if n.split("/", 1)[-1] == name]
    if path.is_file() and (path.suffix in (".yaml", ".yml") or not matches):
        return path
    if path.is_dir() and not matches:
        raise ValueError(f"{path}: is a directory, but a recipe (a YAML file or a packaged recipe's name) is expected")
    if path.exists() and not path.is_file() and not matches:  # a FIFO, a socket, a device: there, so never "not found"
        raise ValueError(f"{path}: is no regular file (a FIFO, a socket or a device), but a recipe (a YAML file or a "
                         "packaged recipe's name) is expected")  # fmt: skip
    if len(matches) == 1:
        return _root() / f"{matches[0]}.yaml"
    if len(matches) > 1:
        raise ValueError(f"recipe {name_or_path!r} is ambiguous: {', '.join(matches)}")
    candidates = names + [n.split("/", 1)[-1] for n in names]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"{name_or_path}: recipe file not found, and no packaged recipe of that name{hint}; "
                     f"packaged recipes: {', '.join(names)}")  # fmt: skip


def copy_recipe(name: str, dest: str | Path, force: bool = False) -> Path:
    """Copy the recipe ``name`` (packaged, or any YAML file) to ``dest`` (a folder, or a path ending in ``/``, made
    if missing: ``dest/<name>.yaml``) to start a configuration; returns the file written. An existing file is never
    replaced unless ``force`` (``FileExistsError``).

    Example::

        >>> import tempfile
        >>> out = copy_recipe("demo/mle", Path(tempfile.mkdtemp()) / "my_mle.yaml")
        >>> out.read_text() == resolve_recipe("demo/mle").read_text()
        True
    """
    from finecap.utils.files import atomic_write_bytes

    source = resolve_recipe(name)
    folder = str(dest).endswith(("/", os.sep))  # `recipes cp demo/smile mine/`: a folder, even before it exists
    dest = Path(dest)
    if folder or dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not force:
        raise FileExistsError(f"{dest}: already exists; choose another file, or pass --force to overwrite it")
    atomic_write_bytes(dest, source.read_bytes())
    return dest
