"""The ``run`` section: where a run writes, its name and seed."""

from __future__ import annotations

from dataclasses import dataclass

from finecap.config.fields import ConfigError, Section, doc
from finecap.utils.text import CONTROL_CHARACTERS, short_repr


@dataclass
class RunConfig(Section, name="run"):
    """Where a run writes; :func:`finecap.home.run_dir` resolves its folder (the finecap home is no concern of the
    configuration)."""

    name: str = doc("run", "Run name; the run directory is <run.root>/<run.name> unless run.dir is set.")
    root: str = doc("", "Folder holding run directories; empty = <finecap home>/runs (never the working directory).")
    dir: str = doc("", "Explicit run directory (overrides root/name when non-empty).")
    seed: int = doc(
        0,
        "Global random seed (torch, numpy, python).",
        ge=-(2**63),
        le=2**64 - 1,
        why="torch.manual_seed's range",
    )
    cache_dir: str = doc(
        "", "Folder of the reusable caches (world encoders, frozen features); empty = <finecap home>/cache."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        control = CONTROL_CHARACTERS.search(self.name)
        if control is not None:
            raise ConfigError(
                f"run.name: {short_repr(self.name)} holds the control character {control.group()!r} (a newline, a "
                "tab, ...); a run's name names its folder and heads its model card: use printable characters",
                key="run.name",
            )
