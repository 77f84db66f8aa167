"""A run's name must name a folder below the runs root (finecap.home.run_path)."""

import pytest

from finecap.config import ConfigError, load, load_stored
from finecap.home import run_path


@pytest.mark.parametrize("name", ["", ".", "./", "a/.."])
def test_a_run_name_naming_no_folder_is_refused_where_the_run_folder_is_chosen(name, tmp_path):
    # `finecap train demo/mle run.name=` trained into <run.root>/ itself: the folder holding every run got the run's
    # checkpoints/, metrics.jsonl and config.yaml
    cfg = load(None, [f"run.root={tmp_path}", f"run.name='{name}'"])
    with pytest.raises(ConfigError, match=rf"run.name: '{name}' names no folder below the runs root \({tmp_path}\)"):
        run_path(cfg.run)
    assert run_path(load(None, [f"run.root={tmp_path}", f"run.name='{name}'", "run.dir=x"]).run).as_posix() == "x"
    assert run_path(load(None, [f"run.root={tmp_path}", "run.name=demo/mle"]).run) == tmp_path / "demo" / "mle"
    stored = tmp_path / "config.yaml"  # a configuration stored by a run trained so before still loads, to caption
    cfg.save(stored)
    assert load_stored(stored).run.name == name
