"""The ``finecap`` command: parse arguments, build the configuration, call one function per command.

Every command that takes a recipe accepts dotlist overrides after it: ``finecap train RECIPE.yaml train.lr=1e-4``.
Options may come before or after them. Every command takes ``-v`` / ``-q`` (more or less logging, finecap's and its
libraries') and ``--debug`` (a traceback instead of the one-line error; ``FINECAP_DEBUG=1`` does the same). Errors on
users' inputs and disks exit with code 2 and one message naming the file, key or override at fault
(:mod:`finecap.errors`). See docs/cli.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import math
import os
import re
import select
import shlex
import signal
import sys
import threading
import time
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from finecap.config import (
    SECTIONS,
    Config,
    ConfigError,
    describe,
    did_you_mean,
    load,
    masked_override,
    masked_url_secrets,
    override_key,
)
from finecap.config.secrets import MASK, SECRET_KEYS, environment_advice, looks_secret, on_command_line_message
from finecap.errors import AnotherProcessFailed, explain
from finecap.library_warnings import silenced
from finecap.recipes import copy_recipe, describe_recipe, list_recipes, resolve_recipe
from finecap.registry import ENGINES, PREDICTION_FORMATS
from finecap.utils.files import check_fsync_setting
from finecap.utils.system import (
    environment_defaults,
    hangup_as_sigterm,
    launched_processes,
    launched_rank,
    leave_process_group,
)
from finecap.utils.text import closest, shell_command

log = logging.getLogger(__name__)


def _split_recipe(items: list[str]) -> tuple[str | None, list[str]]:
    """The first item is a recipe when it does not look like an override (``key=value``)."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


OVERRIDES_ENV = "FINECAP_OVERRIDES"
"""The environment variable whose ``section.key=value`` words every command that reads a configuration appends after
its command line's overrides (docs/configuration.md, "Overrides from the environment")."""


def environment_overrides() -> list[str]:
    """:data:`OVERRIDES_ENV`'s overrides, split as a shell splits words (``[]`` when unset or blank), said on stderr
    (secrets masked) so no setting hides: they land in the run's ``config.yaml`` and ``finecap config`` like any
    other override. A word that is not ``section.key=value`` is an error naming the variable."""
    text = os.environ.get(OVERRIDES_ENV, "").strip()
    if not text:
        return []
    try:
        items = shlex.split(text)
    except ValueError as e:  # its value is not repeated: it may hold a secret
        raise ConfigError(f"{OVERRIDES_ENV}: cannot split its value into words ({e}); check its quotes") from None
    for n, item in enumerate(items):
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"{OVERRIDES_ENV}: word {n + 1}, {shown_word(items, n)!r}, is not section.key=value")
    print(f"finecap: {OVERRIDES_ENV} appends {' '.join(map(masked_override, items))}", file=sys.stderr)
    return items


def shown_extras(extras: Sequence[str]) -> list[str]:
    """Words argparse did not recognise, as an error may show them: a bare word right after an unknown option (its
    value: ``--token SECRET``) as ``***``, ``key=value`` words masked (:func:`finecap.config.masked_override`)."""
    out = []
    for n, word in enumerate(extras):
        after_option = n and extras[n - 1].startswith("-") and "=" not in extras[n - 1]
        out.append(MASK if after_option and not word.startswith("-") else masked_override(word))
    return out


def shown_word(words: Sequence[str], n: int) -> str:
    """Word ``n`` of ``words`` as an error message may show it (:func:`finecap.config.masked_override`), or ``***``
    when the word before it sets a secret-named key and ends at its ``=`` (``boost.llm_api_key= sk-...``: the value
    split off by a space), or ``key ***`` when it starts with a secret-named key without ``=``
    (``boost.llm_api_key: sk-...``)."""
    word = words[n]
    if n and words[n - 1].endswith("=") and masked_override(words[n - 1] + "x").endswith(MASK):
        return MASK
    head = re.split(r"[\s:]", word.strip(), maxsplit=1)[0]
    if "=" not in word and head != word.strip() and looks_secret(head):
        return f"{head} {MASK}"
    return masked_override(word)


def command_line_secrets(args: argparse.Namespace) -> list[str]:
    """The warnings about the secrets the parsed command line ``args`` holds, one line each naming the option and the
    safer route (:func:`finecap.config.secrets.on_command_line_message`): ``finecap bags review --token`` (its
    ``--token-file`` or the environment's ``$FINECAP_REVIEW_TOKEN``) and an override of a key of
    :data:`~finecap.config.secrets.SECRET_KEYS` (``boost.llm_api_key=...``: an environment variable named by
    ``boost.llm_api_key_env``). Every user of the machine reads a process's arguments (``ps``); finecap cannot
    reliably hide them once it runs, so it says so at start. :data:`OVERRIDES_ENV` is not the command line: the
    environment of a process is its user's alone."""
    said = []
    if getattr(args, "token", None) is not None:
        from finecap.app.review import TOKEN_ENV

        said.append(on_command_line_message("--token", f"give --token-file (a file of yours, chmod 600) or set "
                                            f"${TOKEN_ENV} instead"))  # fmt: skip
    for item in getattr(args, "items", None) or ():
        key = override_key(item) if "=" in item else ""
        if key in SECRET_KEYS:
            said.append(on_command_line_message(f"{key}=", environment_advice(key)))
    return said


def _config(args: argparse.Namespace, flag_overrides: dict[str, str] | None = None) -> Config:
    """The command's configuration: its recipe, ``flag_overrides`` (:func:`_flags`: an error about one names the
    option), then the overrides of the command line and of :data:`OVERRIDES_ENV`."""
    recipe, overrides = _split_recipe([*args.items, *environment_overrides()])
    for n, item in enumerate(overrides):
        if "=" not in item:
            raise ConfigError(
                f"argument {shown_word(overrides, n)!r}: expected section.key=value (only the first argument may be a "
                "recipe)"
            )
    return load(recipe, [*(flag_overrides or {}), *overrides], labels=flag_overrides)


def _recipe_file(args: argparse.Namespace) -> Path | None:
    """The recipe file the command's configuration is read from (an input no output may replace), or ``None``."""
    recipe, _ = _split_recipe(list(args.items))
    return resolve_recipe(recipe) if recipe else None


FOLDER_FLAGS = ("out",)
"""Flags naming a folder: their text is the folder's name as typed, never read as YAML (``--out [a]`` is a folder of
that name); one that names no folder (empty, or ``null``, ``none``, ``~``, which a path option reads as no path:
:func:`finecap.config.loading.empty_path`) is refused, where it sent the run or world to the default folder."""


def _flags(args: argparse.Namespace, mapping: dict[str, str]) -> dict[str, str]:
    """Turn command-line flags that were given into ``section.key=value`` overrides, each mapped to the option's words
    as typed (``{"world.n_train=-3": "--n-train -3"}``: what a configuration error about it names); a folder flag's
    value (:data:`FOLDER_FLAGS`) is quoted, so that it stays the text typed, and one naming no folder is refused."""
    out = {}
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        option = f"--{attr.replace('_', '-')}"
        label = option if value == "true" and attr == "force" else f"{option} {value}"  # a store_const flag: no value
        if attr in FOLDER_FLAGS:
            if str(value).strip().lower() in ("", "null", "none", "~"):
                raise UsageError(f"--{attr} {str(value)!r} names no folder: give a folder, or leave --{attr} out for "
                                 f"{key}'s default")  # fmt: skip
            value = json.dumps(str(value))  # a YAML double-quoted scalar: the text itself
        out[f"{key}={value}"] = label
    return out


# --------------------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------------------
# Each command imports its application module when it runs, not at the top of this file: most of them import torch
# and transformers (seconds), which `finecap config` and text-only `finecap eval` never need (tests/app/test_cli.py
# checks that `finecap eval --metrics bleu,rouge,cider` imports neither).


def cmd_world_make(args: argparse.Namespace) -> None:
    from finecap.app.world import main

    flags = {
        "out": "world.out",
        "n_train": "world.n_train",
        "n_val": "world.n_val",
        "n_test": "world.n_test",
        "seed": "world.seed",
        "image_size": "world.image_size",
        "families": "world.families",
        "force": "world.overwrite",
    }
    main(_config(args, _flags(args, flags)))


def cmd_retriever_train(args: argparse.Namespace) -> None:
    from finecap.app.retriever import main

    main(_config(args))


def cmd_retriever_probe(args: argparse.Namespace) -> None:
    from finecap.app.retriever import probe_main

    probe_main(_config(args), out=args.out)


def cmd_train(args: argparse.Namespace) -> None:
    if not args.items and args.out is None:  # --resume alone: which run? (it trained the defaults into runs/run)
        raise UsageError(train_usage())
    recipe, _ = _split_recipe(list(args.items))
    if args.resume and recipe is None and args.out is not None:
        cfg = _stored_run_config(args)
    else:
        cfg = _config(args, _flags(args, {"out": "run.dir"}))
    if args.dry_run:
        if args.resume:
            raise ValueError("--dry-run builds a fresh run and trains nothing; it does not take --resume")
        from finecap.train.run import dry_run

        dry_run(cfg)
        return
    from finecap.train.run import train

    option = "run.dir" if args.out is None else "--out"  # the errors about the run folder name what the user typed
    train(cfg, resume=args.resume, recipe=_recipe_file(args), run_dir_option=option)


def _stored_run_config(args: argparse.Namespace) -> Config:
    """``finecap train --resume --out RUN [key=value ...]`` without a recipe: the settings RUN was trained with, the
    overrides on top (:func:`finecap.config.stored.resume_config`, which ``finecap.train(RUN, resume=True)`` reads
    too)."""
    from finecap.config.stored import resume_config

    _, overrides = _split_recipe([*args.items, *environment_overrides()])
    return resume_config(args.out, overrides, asked=f"--resume --out {args.out}",
                         with_recipe="finecap train RECIPE --resume --out RUN")  # fmt: skip


def number(low: float, high: float, kind: type = float) -> Callable[[str], typing.Any]:
    """An argparse ``type`` reading a finite number from ``low`` to ``high`` (``kind`` ``int``: a whole one): a
    value beyond is argparse's one-line error naming the option and the range, never a traceback or a server that
    waits for ever (``--batch-wait-ms inf``)."""

    def read(text: str) -> typing.Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got "
                                             f"{text!r}") from None  # fmt: skip
        if not ((kind is int or math.isfinite(value)) and low <= value <= high):  # isfinite overflows on a huge int
            shown = f"{int(low)} to {int(high)}" if kind is int else f"{low:g} to {high:g}"  # a seed's 2**63 - 1 whole
            given = text if len(text) <= 40 else text[:40] + "..."
            raise argparse.ArgumentTypeError(f"must be from {shown}, got {given}")
        return value

    read.__name__ = "number"
    return read


class UsageError(Exception):
    """A command given too little to do anything: ``main`` prints the message (its usage) and exits 2."""


def train_usage() -> str:
    """What a bare ``finecap train`` prints: how to call it and the packaged recipes (it would otherwise start the
    default pipeline: a 10,000-image world, its encoder and a ClipCap, which nobody asks for by typing no recipe)."""
    width = max(map(len, list_recipes()))
    rows = "\n".join(f"  {name:<{width}}  {describe_recipe(name)}" for name in list_recipes())
    return ("usage: finecap train RECIPE [section.key=value ...] [--out DIR] [--resume]\n"
            "  RECIPE is a packaged recipe below or a YAML file; `finecap train key=value ...` (overrides only) "
            "trains the defaults; `finecap train --resume --out RUN [key=value ...]` resumes RUN with its own "
            "settings.\n  Example: finecap train demo/mle train.max_steps=100 --out runs/mle\n"
            f"packaged recipes:\n{rows}")  # fmt: skip


def _images_and_overrides(images: list[str] | None) -> tuple[list[str] | None, list[str]]:
    """``--images`` takes every argument after it, so ``--images a.jpg b/ decode.beam_size=3`` reads the override as an
    image too: an item that names no existing file or folder and reads as ``section.key=value`` is an override."""
    if images is None:
        return None, []
    override = [i for i in images if "=" in i and "." in i.split("=", 1)[0] and not Path(i).exists()]
    return [i for i in images if i not in override], override


def cmd_caption(args: argparse.Namespace) -> None:
    from finecap.app.caption import main

    images, trailing = _images_and_overrides(args.images)
    recipe, overrides = _split_recipe([*args.items, *environment_overrides()])  # on the checkpoint's config
    flags = _flags(args, {"engine": "decode.engine"})  # an error about it names --engine, as _config's do
    main(checkpoint=args.checkpoint, split=args.split, out=args.out, data=args.data, images=images, recipe=recipe,
         overrides=[*flags, *overrides, *trailing], force=args.force, skip_bad_images=args.skip_bad_images,
         labels=flags)  # fmt: skip


def cmd_export(args: argparse.Namespace) -> None:
    from finecap.app.export import main

    main(args.checkpoint, args.merged, merged=args.merged is not None, force=args.force)


def cmd_eval(args: argparse.Namespace) -> None:
    from finecap.app.eval import main

    main(
        _config(args, _flags(args, {"judge": "judge.name"})),
        predictions=args.predictions,
        references=args.references,
        images=args.images,
        bags=args.bags,
        instances=args.instances,
        metrics=args.metrics,
        predictions_format=args.predictions_format,
        out=args.out,
        split=args.split,
        fmt=args.format,
        per_image=args.per_image,
        force=args.force,
        recipe=_recipe_file(args),
    )


def cmd_bags_build(args: argparse.Namespace) -> None:
    from finecap.app.bags import main

    main(_config(args), data=args.data, split=args.split, sizes=args.sizes, out=args.out, force=args.force,
         recipe=_recipe_file(args))  # fmt: skip


def cmd_questions_make(args: argparse.Namespace) -> None:
    from finecap.app.questions import main

    main(_config(args, _flags(args, {"judge": "judge.name"})), out=args.out, data=args.data, split=args.split,
         force=args.force, recipe=_recipe_file(args), per_image=args.per_image)  # fmt: skip


def cmd_bags_review(args: argparse.Namespace) -> None:
    from finecap.app.review import main
    from finecap.utils.token_file import read_token

    token = read_token(args.token_file) if args.token_file else args.token  # read as serve-reward's --token-file
    main(args.bags, args.images, data=args.data, out=args.out, host=args.host, port=args.port, token=token)


def cmd_report(args: argparse.Namespace) -> None:
    from finecap.app.report import main

    main(args.run_dir, args.out, items=args.items, n_sample=args.sample, n_disagree=args.disagree, n_bags=args.bags,
         retrieval=not args.no_bag_outcomes, force=args.force, plots=args.plots)  # fmt: skip


def cmd_demo(args: argparse.Namespace) -> None:
    from finecap.app.demo import load_demo_config, main

    recipe, items = _split_recipe(list(args.items))
    flags = list(_flags(args, {"out": "run.dir"}))
    if args.force:
        flags.append("demo.force=true")
    if args.stages is not None:  # given empty (`--stages "$STAGES"`): refused, never read as the default list
        flags.append(f"demo.stages=[{args.stages}]")
    items = [*flags, *items, *environment_overrides()]
    main(load_demo_config(recipe, items, args.quick), items=items, quick=args.quick, recipe=recipe)


def cmd_boost(args: argparse.Namespace) -> None:
    from finecap.app.boost import main

    main(_config(args), out=args.out)


def cmd_serve_reward(args: argparse.Namespace) -> None:
    if not args.items:
        raise UsageError("usage: finecap serve-reward RECIPE [section.key=value ...] [--host H] [--port P]\n"
                         "  serves the recipe's rl.rewards over HTTP (docs/integrations.md); e.g. "
                         "finecap serve-reward demo/sr_bagcurri --port 8000")  # fmt: skip
    from finecap.app.serve_reward import main
    from finecap.serve.app import ConnectionLimits
    from finecap.serve.protocol import Limits
    from finecap.utils.token_file import read_token

    limits = Limits(max_request_bytes=args.max_request_bytes, max_captions=args.max_captions,
                    max_caption_chars=args.max_caption_chars, max_references=args.max_references)  # fmt: skip
    connections = ConnectionLimits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                                   max_connections=args.max_connections,
                                   write_timeout=args.write_timeout)  # fmt: skip
    token = read_token(args.token_file) if args.token_file else None
    main(_config(args), host=args.host, port=args.port, limits=limits, batch_size=args.batch_size,
         batch_wait_ms=args.batch_wait_ms, log_every=args.log_every, token=token, connections=connections,
         allowed_hosts=args.allowed_hosts, score_timeout=args.score_timeout,
         max_queued_bytes=args.max_queued_bytes)  # fmt: skip


def cmd_models_tiny(args: argparse.Namespace) -> None:
    from finecap.app.models import tiny_main

    tiny_main(args.kind, args.out, hidden=args.hidden, heads=args.heads, seed=args.seed)


def cmd_recipes(args: argparse.Namespace) -> None:
    if getattr(args, "action", None) == "cp":
        out = copy_recipe(args.name, args.file, force=args.force)
        print(f"copied {args.name} to {out}; run it with: {shell_command(['finecap', 'train', out])}")
        return
    width = max(map(len, list_recipes()))
    for name in list_recipes():
        print(f"{name:<{width}}  {describe_recipe(name)}")


def cmd_config(args: argparse.Namespace) -> None:
    if args.describe:
        for name, cls in SECTIONS.items():
            print(f"[{name}]")
            for key, tp, default, text in describe(cls):
                print(f"  {name}.{key} ({tp}, default {default!r}): {text}")
        return
    print(yaml.safe_dump(_config(args).to_dict(redact=True), sort_keys=False), end="")  # secrets masked


# --------------------------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------------------------

DESCRIPTION = "finecap trains and evaluates image captioners that say more than maximum-likelihood captions do."
EPILOG = """start here:
  finecap demo --quick              the whole pipeline on the embedded world, offline (about a minute)
  finecap recipes                   the packaged recipes; run one with `finecap train NAME key=value ...`
  finecap eval --predictions P.json --references REFS   score captions (pycocoevalcap's metrics and more)
  finecap COMMAND --help            a command's options; docs/cli.md has them all"""
OVERRIDES_HELP = "optional recipe YAML, then section.key=value overrides (e.g. train.lr=1e-4)"
FORCE_FILE_HELP = "replace an existing output file that finecap did not make (never one of the command's inputs)"
OUT_HELP = "run directory (run.dir; default <run.root>/<run.name>); --run-dir is the same option"


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for mistyped commands and choices, and options allowed between positional
    arguments (``finecap train RECIPE --resume train.max_steps=9``: ``parse_intermixed_args`` for each command).
    Options are never abbreviated: ``serve-reward --token SECRET`` was read as ``--token-file SECRET`` and the
    secret printed as a missing file's name."""

    _intermixed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(value, action.choices)} "
                                                 f"(choose from {choices})")  # fmt: skip

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's signature
        """argparse's, with a did-you-mean for a mistyped option (``--reusme``), asked of the command's own parser
        (``finecap train``'s options for ``finecap train --reusme``), as for commands, keys and values."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = _command_parser(self, parsed)
            first = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), None)
            hint = option_hint(first, owner._option_string_actions) if first else ""
            owner.error(f"unrecognized arguments: {' '.join(shown_extras(extras))}{hint}")
        return parsed

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's signature
        if self._subparsers is not None or self._intermixed:
            return super().parse_known_args(args, namespace)
        self._intermixed = True  # parse_known_intermixed_args calls parse_known_args itself
        self._given = list(args) if args is not None else sys.argv[1:]
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False

    def error(self, message: str) -> typing.NoReturn:
        """argparse's, but a missing required option that an unrecognised one misspells says so
        (``caption --checkpiont runs/a``: "required: --checkpoint" alone hid the typo), and a word read as an option
        that names a file or folder here says how to name it (``caption --images -1.jpg``: argparse's "expected at
        least one argument" alone said nothing of the file)."""
        if message.startswith("the following arguments are required"):
            # argparse's intermixed parsing lists the optional positionals (nargs "*": the overrides) as required
            optional = {a.metavar or a.dest for a in self._actions if not a.option_strings and a.nargs == "*"}
            named = [n for n in message.split(": ", 1)[1].split(", ") if n not in optional]
            message = f"the following arguments are required: {', '.join(named)}" if named else message
            for word in getattr(self, "_given", ()):
                name = word.split("=", 1)[0]
                if name.startswith("--") and name not in self._option_string_actions:
                    hint = option_hint(name, self._option_string_actions)
                    if hint:
                        message += f"; unrecognized argument {name!r}{hint}"
                        break
        message += dash_file_hint(getattr(self, "_given", ()), self._option_string_actions)
        super().error(message)


def option_hint(name: str, options: Iterable[str]) -> str:
    """:func:`finecap.config.did_you_mean` for a mistyped option ``name`` among ``options``, the names compared
    without their leading dashes, which every option shares (``export --out`` was "close" to ``--quiet`` by its
    ``--`` alone); ``""`` when no option's name is close.

    Example::

        >>> option_hint("--reusme", ["--resume", "-q", "--quiet"]), option_hint("--out", ["-q", "--quiet", "--merged"])
        (" (did you mean '--resume'?)", '')
    """
    by_name: dict[str, str] = {}
    for option in options:
        by_name.setdefault(option.lstrip("-"), option)
    match = closest(name.lstrip("-"), by_name)
    return f" (did you mean {by_name[match]!r}?)" if match is not None else ""


def dash_file_hint(words: Sequence[str], options: typing.Container[str]) -> str:
    """What a command line error adds when one of ``words`` begins with ``-``, is none of ``options`` and names a file
    or folder that exists: argparse reads it as an option, so it never reached the command as a path; ``""`` else.

    Example (``-`` alone is no option: argparse passes it as a value)::

        >>> dash_file_hint(["--images", "-"], ["--images"])
        ''
    """
    for word in words:
        if len(word) > 1 and word.startswith("-") and word not in options and os.path.lexists(word):
            return f"; {word!r} is read as an option, though a file of that name is here: name it ./{word}"
    return ""


def _command_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``parsed`` was read by (``finecap bags build`` -> that of ``build``)."""
    for name in ("command", "action"):
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(parsed, name, None)
        if sub is None or chosen not in sub.choices:
            break
        parser = sub.choices[chosen]
    return parser


def _common(defaults: bool) -> argparse.ArgumentParser:
    """-v/-q/--debug, accepted before the command (``defaults``) and after it (no defaults: given values win)."""
    p = argparse.ArgumentParser(add_help=False)
    unset = argparse.SUPPRESS
    p.add_argument("-v", "--verbose", action="count", default=0 if defaults else unset,
                   help="more messages (-v: finecap's debug messages and the libraries' info)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="count", default=0 if defaults else unset,
                   help="warnings and errors only, no progress bars")  # fmt: skip
    p.add_argument("--debug", action="store_true", default=False if defaults else unset,
                   help="show the traceback of an error (FINECAP_DEBUG=1 does the same)")  # fmt: skip
    return p


COMMON = _common(defaults=False)


def _group(sub: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    return sub.add_parser(name, help=help, parents=[COMMON]).add_subparsers(dest="action", required=True)


def _add(sub: argparse._SubParsersAction, name: str, func: Callable, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help, parents=[COMMON])
    p.add_argument("items", nargs="*", metavar="[RECIPE] [key=value ...]", help=OVERRIDES_HELP)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="finecap", description=DESCRIPTION, epilog=EPILOG, parents=[_common(defaults=True)],
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--version", action="version", version=f"finecap {__import__('finecap').__version__}")
    sub = parser.add_subparsers(dest="command")  # none: main prints the help, as for `finecap` alone

    world = _group(sub, "world", "the embedded synthetic world")
    p = _add(world, "make", cmd_world_make, "Generate the synthetic world data set (images, captions, scene graphs).")
    p.add_argument("--out", help="output folder (world.out)")
    p.add_argument("--n-train", dest="n_train", type=int, help="training scenes (world.n_train)")
    p.add_argument("--n-val", dest="n_val", type=int, help="validation scenes (world.n_val)")
    p.add_argument("--n-test", dest="n_test", type=int, help="test scenes (world.n_test)")
    p.add_argument("--seed", type=int, help="world seed (world.seed)")
    p.add_argument("--image-size", dest="image_size", type=int, help="image side in pixels (world.image_size)")
    p.add_argument("--families", type=int, help="scene-family size, 0 = off (world.families)")
    force_help = "replace another finecap world at --out: only the files finecap made (world.overwrite)"
    p.add_argument("--force", action="store_const", const="true", help=force_help)

    retr = _group(sub, "retriever", "the CLIP retriever")
    _add(retr, "train", cmd_retriever_train, "Train (or reuse from cache) the world encoder / retriever.")
    p = _add(retr, "probe", cmd_retriever_probe, "Linear-probe and caption-retrieval checks of the world encoder.")
    p.add_argument("--out", default=None, help="JSON file for the probe results")

    p = _add(sub, "train", cmd_train, "Train a captioner with a recipe.")
    p.add_argument("--resume", action="store_true", help="continue the run from its last checkpoint")
    p.add_argument("--dry-run", dest="dry_run", action="store_true", help="build the run, print the resolved config, "
                   "parameters by part and dtype, a memory estimate and one training step's loss, time and peak "
                   "memory; train and write nothing")  # fmt: skip
    p.add_argument("--out", "--run-dir", dest="out", default=None, help=OUT_HELP)

    p = _add(sub, "caption", cmd_caption, "Caption a data split, or image files, with a trained checkpoint (COCO "
             "results JSON).")  # fmt: skip
    p.add_argument("--checkpoint", required=True, help="run directory (its best checkpoint), checkpoint folder, or "
                   "its model/ folder")  # fmt: skip
    p.add_argument("--data", default=None, help="data set file (default: the checkpoint's data)")
    p.add_argument("--split", default=None, help="split to caption (default test)")
    p.add_argument("--images", nargs="+", default=None, metavar="DIR_OR_FILE", help="caption these image files and "
                   "folders of images (recursive) instead of a data set: no references needed; ids from file names "
                   "(docs/caption.md)")  # fmt: skip
    p.add_argument("--skip-bad-images", dest="skip_bad_images", action="store_true", help="leave out and count "
                   "images that do not decode or that the model refuses (data.skip_bad_images=true); else the first "
                   "is an error")  # fmt: skip
    p.add_argument("--engine", default=None, metavar="|".join(ENGINES), help="what generates (decode.engine): "
                   "finecap's decoder, vLLM serving a VLM captioner (pip install 'finecap[vllm]'; docs/scaling.md), "
                   "or a dotted path pkg.module:Class to one's own engine")  # fmt: skip
    p.add_argument("--out", required=True, help="output COCO results JSON")
    p.add_argument("--force", action="store_true", help=FORCE_FILE_HELP)

    p = sub.add_parser("export", help="Write a trained captioner as a plain checkpoint other tools load.",
                       description="Write a trained captioner as a plain checkpoint other tools load.",
                       parents=[COMMON])  # fmt: skip
    p.add_argument("checkpoint", metavar="RUN", help="run directory (its best checkpoint), checkpoint or model folder")
    p.add_argument("--merged", metavar="OUT", default=None, help="write the captioner with its LoRA adapters merged "
                   "into the base weights to this new folder")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace a captioner folder finecap exported to OUT before")
    p.set_defaults(func=cmd_export)

    p = _add(sub, "eval", cmd_eval, "Evaluate captions (n-gram, CLIP, retrieval, diversity, faithfulness).")
    p.add_argument("--predictions", required=True, help="COCO results JSON, or another toolkit's predictions "
                   "(lmms-eval sample log, VLMEvalKit .xlsx/.tsv/.json, LLaMA-Factory / ms-swift JSONL)")  # fmt: skip
    p.add_argument("--predictions-format", default="auto", choices=("auto", *PREDICTION_FORMATS),
                   help="format of --predictions (default: detected)")  # fmt: skip
    p.add_argument("--references", default=None, help="references (Karpathy/COCO/JSONL/world/Hugging Face data set); "
                   "optional when the predictions file holds them")  # fmt: skip
    p.add_argument("--images", default=None, help="image root for relative paths")
    p.add_argument("--bags", default=None, help="bags JSON from `finecap bags build`")
    p.add_argument("--instances", default=None, metavar="FILE", help="COCO instances_*.json for the hallucination "
                   "metrics (CHAIR; default: eval.instances)")  # fmt: skip
    p.add_argument("--metrics", default=None, help="comma-separated metric names (default: eval.metrics, or what the "
                   "references allow: caption metrics always, image metrics when the images resolve, see "
                   "docs/evaluation.md)")  # fmt: skip
    p.add_argument("--judge", default=None, metavar="NAME", help="judge of the qa, claims and clair metrics (world, "
                   "openai or pkg.module:factory; default: judge.name), docs/methods/judges.md")  # fmt: skip
    p.add_argument("--split", default=None, help="restrict references to this split")
    p.add_argument("--out", default=None, help="also write {metric: value} to this JSON file")
    p.add_argument("--format", choices=("table", "json", "coco"), default="table", help="stdout: Markdown table, "
                   "JSON, or JSON with pycocoevalcap's names (Bleu_4, CIDEr, ...)")  # fmt: skip
    p.add_argument("--per-image", default=None, metavar="FILE", help="also write per-image scores (like "
                   "COCOEvalCap.imgToEval) to this JSON file")  # fmt: skip
    p.add_argument("--force", action="store_true", help=FORCE_FILE_HELP)

    questions = _group(sub, "questions", "multiple-choice questions for the qa_utility reward and the qa metric")
    p = _add(
        questions,
        "make",
        cmd_questions_make,
        "Write an image set's questions (a world's from its scene graphs, "
        "other data's by an LLM judge from the references), less those a blind judge answers.",
    )
    p.add_argument("--out", required=True, help="questions file to write (JSON Lines; judge.questions reads it)")
    p.add_argument("--data", default=None, help="world folder or data set (default: the configured world)")
    p.add_argument("--per-image", type=number(1, 100, int), default=8, help="questions an LLM judge writes per image "
                   "at most (default: 8; 1 to 100)")  # fmt: skip
    p.add_argument("--split", default="train", help="split whose images get questions (default: train)")
    p.add_argument("--judge", default=None, metavar="NAME", help="judge of the blind filter (default: judge.name)")
    p.add_argument("--force", action="store_true", help=FORCE_FILE_HELP)

    bags = _group(sub, "bags", "TrueMatch-style bags")
    p = _add(bags, "build", cmd_bags_build, "Build bags of similar images (NDLB Algorithms 1-2).")
    p.add_argument("--data", default=None, help="data set file (default: the world)")
    p.add_argument("--split", default="test", help="split to build bags on")
    p.add_argument("--sizes", default="3,5,7", help="comma-separated bag sizes")
    p.add_argument("--out", required=True, help="output JSON")
    p.add_argument("--force", action="store_true", help=FORCE_FILE_HELP)

    p = bags.add_parser(
        "review", help="Accept or reject candidate bags in a local web page (saved as you click).", parents=[COMMON]
    )
    p.add_argument("bags", metavar="BAGS.json", help="candidate bags from `finecap bags build`")
    p.add_argument("--images", required=True, help="image root; only files under it are served")
    p.add_argument("--data", default=None, help="data set file for captions (default: the bags file's 'data')")
    p.add_argument("--out", default=None, help="curated bags JSON (default BAGS.curated.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=number(0, 65535, int), default=8765, help="port (0 = any free port)")
    given = p.add_mutually_exclusive_group()
    given.add_argument("--token-file", dest="token_file", default=None, help="a file of yours (chmod 600) whose "
                       "first line is the access token the browser must present, on loopback too (default "
                       "$FINECAP_REVIEW_TOKEN, else one generated and printed in the URL)")  # fmt: skip
    given.add_argument("--token", default=None, help="the access token itself: visible to every user in ps (warned "
                       "about); prefer --token-file")  # fmt: skip
    p.set_defaults(func=cmd_bags_review)

    p = sub.add_parser("report", help="Write a self-contained HTML report of a run directory.", parents=[COMMON])
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (e.g. runs/demo)")
    p.add_argument("items", nargs="*", metavar="key=value", help="overrides of the run's config.yaml")
    p.add_argument("--out", default=None, help="output HTML (default RUN_DIR/report.html, with its plots as PNG files "
                   "in RUN_DIR/plots/; with --out, the one HTML file alone)")  # fmt: skip
    p.add_argument("--plots", default=None, metavar="DIR", help="also write the plots as PNG files into this folder")
    p.add_argument("--force", action="store_true", help=FORCE_FILE_HELP)
    p.add_argument("--sample", type=number(0, 10_000, int), default=8, help="random images in the caption gallery")
    p.add_argument("--disagree", type=number(0, 10_000, int), default=8,
                   help="images where stages disagree most in the gallery")  # fmt: skip
    p.add_argument("--bags", type=number(0, 10_000, int), default=3, help="bags of each size in the bag gallery")
    p.add_argument(
        "--no-bag-outcomes",
        dest="no_bag_outcomes",
        action="store_true",
        help="skip the bag gallery (it loads the retriever)",
    )
    p.set_defaults(func=cmd_report)

    p = _add(sub, "demo", cmd_demo, "Run the whole pipeline on the embedded world and print the results table.")
    p.add_argument("--quick", action="store_true", help="tiny settings (about a minute)")
    p.add_argument(
        "--out",
        "--run-dir",
        dest="out",
        default=None,
        help=OUT_HELP.replace("<run.name>", "demo, or demo-quick with --quick"),
    )
    p.add_argument("--force", action="store_true", help="re-run stages whose outputs exist")
    p.add_argument("--stages", default=None, help="comma-separated stages to run (default demo.stages)")

    p = _add(
        sub,
        "boost",
        cmd_boost,
        "Visual Caption Boosting: rewrite a data set's captions (BlendCap/VisualCap/HolisticCap).",
    )
    p.add_argument("--out", required=True, help="output folder (resumable: re-run with the same --out)")

    p = _add(sub, "serve-reward", cmd_serve_reward, "Serve a recipe's rewards (rl.rewards) over HTTP to RL trainers "
             "(OpenRLHF, verl, ms-swift, TRL by url=; docs/integrations.md).")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--allow-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                   help="a host name clients reach the server by (a docker-compose service, a cluster's DNS name), "
                   "answered in the Host header beside the bound address, loopback and, with --host 0.0.0.0, IP "
                   "addresses and this machine's names; repeatable")  # fmt: skip
    p.add_argument("--port", type=number(0, 65535, int), default=8000, help="port (default 8000; 0 = any free port, "
                   "printed)")  # fmt: skip
    p.add_argument("--token-file", dest="token_file", default=None, help="a file holding a bearer token every "
                   "request must carry (Authorization: Bearer ...; the clients read $FINECAP_REWARD_TOKEN); advised "
                   "beyond loopback. Never on the command line")  # fmt: skip
    p.add_argument("--batch-size", dest="batch_size", type=number(1, 1_000_000, int), default=1024, help="captions "
                   "per reward call when concurrent requests are merged (rewards that score each caption alone: "
                   "CIDEr-D; 1024 is CIDEr-D's fastest per caption, benchmarks/reward_server.py)")  # fmt: skip
    p.add_argument("--batch-wait-ms", dest="batch_wait_ms", type=number(0, 60_000), default=0.0, help="milliseconds "
                   "a reward call waits for more requests once one is queued (default 0: those queued meanwhile; at "
                   "most 60000)")  # fmt: skip
    p.add_argument("--score-timeout", dest="score_timeout", type=number(0.001, 86_400), default=120.0,
                   help="seconds a request waits for its values, queued and scored, before a 504 naming this option "
                   "(default 120: under the 180 s of finecap's clients; a hung reward call is never stopped, GET "
                   "/health then says 'stuck': restart the server)")  # fmt: skip
    p.add_argument("--max-request-bytes", dest="max_request_bytes", type=number(1, 2**31, int), default=16 * 2**20,
                   help="largest request body (413 beyond; default 16 MiB)")  # fmt: skip
    p.add_argument("--max-queued-bytes", dest="max_queued_bytes", type=number(1, 2**40, int), default=256 * 2**20,
                   help="bytes of the request bodies waiting for the reward at most (503 with Retry-After beyond, "
                   "which finecap's client retries; default 256 MiB, far above a trainer's queue; at least "
                   "--max-request-bytes)")  # fmt: skip
    p.add_argument("--max-captions", dest="max_captions", type=number(1, 10_000_000, int), default=8192,
                   help="captions per request at most (413 beyond)")  # fmt: skip
    p.add_argument("--max-caption-chars", dest="max_caption_chars", type=number(1, 10_000_000, int),
                   default=20_000, help="characters per caption or reference at most (413 beyond)")  # fmt: skip
    p.add_argument("--max-references", dest="max_references", type=number(1, 100_000_000, int), default=65_536,
                   help="reference captions per request at most, all captions together (413 beyond)")  # fmt: skip
    p.add_argument("--header-timeout", dest="header_timeout", type=number(0.001, 3600), default=10.0,
                   help="seconds for a request's headers to arrive (the connection is closed after)")  # fmt: skip
    p.add_argument("--body-timeout", dest="body_timeout", type=number(0.001, 3600), default=60.0,
                   help="seconds for a request's body to arrive (408 after)")  # fmt: skip
    p.add_argument("--write-timeout", dest="write_timeout", type=number(0.001, 3600), default=60.0,
                   help="seconds a reply waits for its client to read more of it (the connection is then aborted, "
                   "the reply dropped)")  # fmt: skip
    p.add_argument("--max-connections", dest="max_connections", type=number(1, 65_536, int), default=256,
                   help="connections open at once (beyond, new ones are closed; kept under ulimit -n); 2 more "
                   "answer GET /health alone, for a supervisor's probe")  # fmt: skip
    p.add_argument("--log-every", dest="log_every", type=number(0, 86_400), default=60.0, help="seconds between "
                   "throughput lines (0: none)")  # fmt: skip
    p.set_defaults(log_timestamps=True)  # a server left running for days: its log lines say when (UTC)

    models = _group(sub, "models", "tiny models for trying finecap offline")
    p = models.add_parser("tiny", help="Write a tiny random-weight CLIP, BLIP or VLM (any supported family) as a "
                          "transformers folder, servable by every engine on a CPU (docs/vlm.md#tiny-models).",
                          parents=[COMMON])  # fmt: skip
    p.add_argument("kind", metavar="KIND", help="clip, blip or a VLM family (model_type: llava, idefics3, qwen2_vl, "
                   "smolvlm, ...; docs/vlm.md)")  # fmt: skip
    p.add_argument("--out", required=True, help="new (or empty) folder to write")
    p.add_argument("--hidden", type=number(4, 4096, int), default=64, help="language model width (default 64)")
    p.add_argument("--heads", type=number(1, 64, int), default=2, help="attention heads (default 2: heads of 32, "
                   "which vLLM's CPU attention takes)")  # fmt: skip
    p.add_argument("--seed", type=number(0, 2**63 - 1, int), default=0, help="seed of the random weights")
    p.set_defaults(func=cmd_models_tiny)

    p = sub.add_parser("recipes", help="List the packaged recipes (run one with `finecap train NAME`).",
                       description="List the packaged recipes, or copy one to start a configuration of your own.",
                       parents=[COMMON])  # fmt: skip
    p.set_defaults(func=cmd_recipes)
    cp = p.add_subparsers(dest="action").add_parser(
        "cp", help="Copy a packaged recipe to FILE to edit it (torchtune's `tune cp`).", parents=[COMMON]
    )
    cp.add_argument("name", metavar="NAME", help="packaged recipe (see `finecap recipes`), e.g. demo/smile")
    cp.add_argument("file", metavar="FILE", help="where to write it (a folder: FOLDER/<name>.yaml)")
    cp.add_argument("--force", action="store_true", help="overwrite FILE when it exists")

    p = _add(sub, "config", cmd_config, "Print the resolved configuration (or all keys with --describe).")
    p.add_argument("--describe", action="store_true", help="list every key with its type, default and doc")
    return parser


# --------------------------------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------------------------------

LIBRARY_LOGGERS = ("transformers", "accelerate", "datasets", "huggingface_hub", "peft", "bitsandbytes")
"""Loggers of the libraries finecap drives; -q/-v set their level with finecap's."""


class _Plain(logging.Formatter):
    """finecap's messages as they are, but for the credentials of URLs (masked: :func:`masked_url_secrets`); warnings
    and errors led by ``warning:`` / ``error:``; with ``stamped``, every line led by its time, ISO 8601 in UTC
    (``2026-11-27T22:21:20.123Z``: a command that runs for days, ``serve-reward``, logs when things happened)."""

    def __init__(self, fmt: str, stamped: bool = False) -> None:
        super().__init__(fmt)
        self.stamped = stamped

    def format(self, record: logging.LogRecord) -> str:
        text = masked_url_secrets(super().format(record))
        text = f"{record.levelname.lower()}: {text}" if record.levelno >= logging.WARNING else text
        if not self.stamped:
            return text
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        return f"{when.strftime('%Y-%m-%dT%H:%M:%S')}.{when.microsecond // 1000:03d}Z {text}"


@contextlib.contextmanager
def _shortened_records(max_lines: int = 3) -> Iterator[None]:
    """At ``-v``, a message of more than ``max_lines`` lines keeps its first line and says how many it left out
    (transformers logs whole model and generation configs at info level: most of ``-v``'s output was those); ``-vv``
    shows them whole. Done where records are made (:func:`logging.setLogRecordFactory`), as transformers and datasets
    print through handlers of their own, made when they are first imported, which may be after this starts."""
    make = logging.getLogRecordFactory()

    def shortened(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make(*args, **kwargs)
        lines = record.getMessage().splitlines() if record.levelno < logging.WARNING else []
        if len(lines) > max_lines:
            record.msg, record.args = f"{lines[0]} [... {len(lines) - 1} more lines; -vv shows them]", None
        return record

    logging.setLogRecordFactory(shortened)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


def levels(verbose: int, quiet: int) -> tuple[int, int]:
    """(finecap's, the libraries') logging levels: -q warnings (libraries: errors), default info (libraries:
    warnings), -v debug (libraries: info), -vv debug for both."""
    step = verbose - quiet
    if step < 0:
        return logging.WARNING, logging.ERROR
    if step == 0:
        return logging.INFO, logging.WARNING
    return logging.DEBUG, logging.INFO if step == 1 else logging.DEBUG


@contextlib.contextmanager
def configured_logging(verbose: int = 0, quiet: int = 0, timestamps: bool = False) -> Iterator[None]:
    """finecap's messages (the ``finecap`` logger) to stderr at the chosen level; the libraries' loggers with it
    (transformers reads ``TRANSFORMERS_VERBOSITY`` when it is first imported, so that is set too); progress bars off
    with -q (``TQDM_DISABLE``, read by finecap's bars at each bar, :func:`finecap.utils.system.progress_enabled`;
    ``HF_HUB_DISABLE_PROGRESS_BARS``, and transformers' switch when it is already imported, as it reads the variable
    once). ``timestamps``: each line led by its UTC time (:class:`_Plain`; the commands whose parser sets
    ``log_timestamps``). Everything is put back afterwards (tests call :func:`main` many times in one process).

    Under ``accelerate launch`` a process other than rank 0 (:func:`finecap.utils.system.launched_rank`) logs errors
    alone, finecap's and the libraries', shows no progress bar and no Python warning, whatever the flags and the
    environment say: every process of a launch meets the same notes, so the main process says them once
    (docs/cli.md#verbosity-v-and-q); the error that stops a process is :func:`_run`'s."""
    own, lib = levels(verbose, quiet)
    follower = launched_rank() > 0
    if follower:
        own = lib = logging.ERROR
    env = {"TRANSFORMERS_VERBOSITY": logging.getLevelName(lib).lower(), "DATASETS_VERBOSITY":
           logging.getLevelName(lib).lower()}  # fmt: skip
    if own >= logging.WARNING:
        env |= {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    loggers = [logging.getLogger(name) for name in ("finecap", *LIBRARY_LOGGERS)]
    saved_levels = [lg.level for lg in loggers]
    root = logging.getLogger("finecap")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Plain("%(message)s", stamped=timestamps))
    # the user's own settings win, except on a launched process other than rank 0; an empty one counts as unset, as
    # transformers, datasets and finecap's bars (progress_enabled) read it
    with environment_defaults(env, empty_is_unset=True, override=follower) as added, contextlib.ExitStack() as undo:
        hf_logging = sys.modules.get("transformers.utils.logging")  # reads its variable once: told directly
        if "TQDM_DISABLE" in added and hf_logging is not None and hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            undo.callback(hf_logging.enable_progress_bar)
        root.setLevel(own)
        root.addHandler(handler)
        undo.callback(root.removeHandler, handler)
        undo.callback(lambda: [lg.setLevel(level) for lg, level in zip(loggers, saved_levels, strict=True)])
        for lg in loggers[1:]:
            lg.setLevel(lib)
        undo.enter_context(silenced())
        undo.enter_context(_shortened_records() if verbose - quiet == 1 else contextlib.nullcontext())
        undo.enter_context(warnings.catch_warnings())
        if follower:
            warnings.simplefilter("ignore")
        yield


def debug_requested(args: argparse.Namespace) -> bool:
    """``--debug``, or ``FINECAP_DEBUG`` set to anything but empty, 0, false, no or off (its older spelling)."""
    off = ("", "0", "false", "no", "off")
    return bool(getattr(args, "debug", False)) or os.environ.get("FINECAP_DEBUG", "").strip().lower() not in off


def _close_progress_bars() -> None:
    """End the progress bars an error interrupted, so that the error starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        bar.close()


LAUNCH_GRACE = 10.0
"""Seconds a launched process other than rank 0 waits before it says the error that stops it (:func:`_launch_grace`),
so that rank 0, meeting the same error (the same configuration, the same data), says it before the launcher
(torchrun), seeing one process end, stops the others."""


def _launch_grace() -> bool:
    """On a launched process other than rank 0, wait :data:`LAUNCH_GRACE` seconds before saying the error that stops
    it: whether it is still to be said (``False`` when the launcher stopped this process meanwhile, SIGTERM, because
    rank 0 ended first, having said it). An error this process alone meets is still said, after the wait. ``True``
    at once outside a launch and on rank 0."""
    if launched_rank() == 0:
        return True
    try:
        time.sleep(LAUNCH_GRACE)
    except KeyboardInterrupt:  # Terminated: the launcher's stop, quiet (the error is rank 0's to say)
        return False
    return True


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a scheduler's stop, ``timeout``) or a hang-up (SIGHUP: the SSH session or terminal of a
    command started without ``nohup`` or ``tmux`` closed; :func:`~finecap.utils.system.hangup_as_sigterm`), raised
    in the main thread as Ctrl-C's ``KeyboardInterrupt`` is, so that the same clean-up runs (the output folder's lock
    removed, a boost's ``boost.json`` set to ``interrupted``, the demo's side stages stopped) and the command ends
    with one line and exit code 143 (docs/cli.md#errors), instead of dying at once, silent after its progress bar's
    half line."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the command runs, SIGTERM raises :class:`Terminated` in this process's main thread; a process forked
    from it (a data loader's worker) dies by the signal as before. Left alone when the handler is not the default
    (a caller's own) or when not called from the main thread; put back afterwards."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    main_pid = os.getpid()

    def terminated(signum: int, frame: object) -> None:
        if os.getpid() != main_pid:  # a forked child: die by the signal, as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _parsed(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line. argparse prints a mistake's usage and error itself, then exits 2; under
    ``accelerate launch`` a process other than rank 0 holds them back for :func:`_launch_grace`, as it does its
    other errors (every process is given the same command line)."""
    if launched_rank() == 0:
        return build_parser().parse_args(argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return build_parser().parse_args(argv)
    except SystemExit:
        if said.getvalue() and _launch_grace():
            sys.stderr.write(said.getvalue())
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default ``sys.argv[1:]``); its exit code. No command (no arguments at all, or only
    the options before one: ``finecap -v``, ``finecap --debug``): the help on stderr, exit code 2, as ``git`` alone
    does (argparse said only that a command is required)."""
    args = _parsed(argv)
    if args.command is None:
        build_parser().print_help(sys.stderr)
        return 2
    try:  # a hang-up (an SSH session dropped) is SIGTERM's stop: hangup_as_sigterm calls Terminated's handler
        with sigterm_as_interrupt(), hangup_as_sigterm():
            return _run(args)
    finally:
        leave_process_group()


LAUNCHED_COMMANDS = ("train", "caption")
"""The commands that share their work among the processes of ``accelerate launch``; any other, launched as several
processes, would do all of it in each (``finecap eval``: its table printed, its judges paid, N times): refused."""


def check_one_process(command: str) -> None:
    """A :class:`ConfigError` when ``command`` (not one of :data:`LAUNCHED_COMMANDS`) runs under a launch of
    several processes."""
    if launched_processes() > 1 and command not in LAUNCHED_COMMANDS:
        raise ConfigError(f"finecap {command} runs in one process; it was launched as {launched_processes()} "
                          f"(accelerate launch): run it without the launcher ({' and '.join(LAUNCHED_COMMANDS)} "
                          "share their work among launched processes)")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    """Call the command's function; its error as one message and an exit code (module docstring)."""
    try:
        with configured_logging(args.verbose, args.quiet, getattr(args, "log_timestamps", False)):
            check_one_process(args.command)
            if launched_rank() == 0:  # the same on every process: said once
                for line in command_line_secrets(args):
                    log.warning(line)
            check_fsync_setting()  # not at the first save, hours into a run
            args.func(args)
    except UsageError as e:
        if _launch_grace():  # the same on every process: said once, by rank 0
            print(e, file=sys.stderr)
        return 2
    except AnotherProcessFailed:  # the main process of the launch prints the error; this one only stops
        _launch_grace()  # exiting at once, it could have the launcher stop the main process before it says why
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C (SIGINT), or SIGTERM (Terminated): exit codes as a shell's, 128 + signal
        if debug_requested(args):
            raise
        _close_progress_bars()
        terminated = isinstance(e, Terminated)
        if launched_rank() == 0:  # the launcher passes Ctrl-C or its stop to every process: said once, by rank 0
            with contextlib.suppress(OSError):  # a hung-up terminal (SIGHUP) refuses writes: the line is lost there
                print(f"finecap: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_reader_gone():  # `finecap recipes | head`: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes nowhere
            return 128 + signal.SIGPIPE  # the shell's code of a writer the pipe's end stopped (`yes | head`)
        message = explain(e)
        if message is None or debug_requested(args):
            raise  # a bug, or --debug: the traceback
        _close_progress_bars()
        if not _launch_grace():  # the same on every process (a configuration, the data): said once, by rank 0
            return 2
        print(f"finecap: error: {masked_url_secrets(message)}", file=sys.stderr)  # a URL may hold a password
        return 2
    return 0


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``poll`` reports an error on the writing end): a write
    failing with a broken pipe elsewhere (a socket, a helper process) is still an error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is no file
        return False
    return any(event & select.POLLERR for _, event in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
