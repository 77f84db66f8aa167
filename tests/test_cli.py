"""The CLI parses, builds the configuration and reports errors without a traceback."""

from finecap.app.cli import main


def test_config_prints_resolved(capsys):
    assert main(["config", "world.n_train=42"]) == 0
    assert "n_train: 42" in capsys.readouterr().out


def test_config_describe(capsys):
    assert main(["config", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "world.image_size (int, default 64" in out or "world.image_size (int, default" in out


def test_bad_override_is_a_clean_error(capsys):
    assert main(["config", "train.schedule=exponential"]) == 2
    err = capsys.readouterr().err
    assert "train.schedule" in err and "linear, cosine, constant" in err


def test_missing_recipe_is_a_clean_error(tmp_path, capsys):
    assert main(["config", str(tmp_path / "nope.yaml")]) == 2
    assert "recipe file not found" in capsys.readouterr().err
