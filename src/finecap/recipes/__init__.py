"""finecap's packaged recipes: YAML files shipped inside the package (``demo/*.yaml``: the embedded world;
``coco/*.yaml``: the papers' settings), found by name wherever finecap is installed.

``finecap train demo/smile`` (or just ``smile`` when the name is unambiguous) runs a packaged recipe; a path to a YAML
file that exists always wins. ``finecap recipes`` lists them.

Example::

    >>> "demo/mle" in list_recipes()
    True
    >>> resolve_recipe("smile").name
    'smile.yaml'
"""

from __future__ import annotations

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
    """The first comment line of a recipe (what it trains), without the ``#``."""
    for line in resolve_recipe(name).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_recipe(name_or_path: str | Path) -> Path:
    """A YAML path that exists, else a packaged recipe by name (``demo/smile``, ``demo/smile.yaml``, or ``smile``
    when only one group has it); an unknown name raises ``ValueError`` listing the recipes."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path).removesuffix(".yaml").removesuffix(".yml")
    names = list_recipes()
    matches = [n for n in names if n == name] or [n for n in names if n.split("/", 1)[-1] == name]
    if len(matches) == 1:
        return _root() / f"{matches[0]}.yaml"
    if len(matches) > 1:
        raise ValueError(f"recipe {name_or_path!r} is ambiguous: {', '.join(matches)}")
    raise ValueError(f"{name_or_path}: recipe file not found, and no packaged recipe of that name; "
                     f"packaged recipes: {', '.join(names)}")  # fmt: skip
