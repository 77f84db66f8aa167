"""The ``finecap`` command: parse arguments, build the configuration, call one function per command.

Every command that takes a recipe accepts dotlist overrides after it: ``finecap train RECIPE.yaml train.lr=1e-4``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import yaml

from finecap.config import SECTIONS, Config, ConfigError, describe, load
from finecap.recipes import describe_recipe, list_recipes


def _split_recipe(items: list[str]) -> tuple[str | None, list[str]]:
    """The first item is a recipe when it does not look like an override (``key=value``)."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _config(args: argparse.Namespace, flag_overrides: list[str] | None = None) -> Config:
    recipe, overrides = _split_recipe(list(args.items))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"argument {item!r}: expected section.key=value (only the first argument may be a recipe)"
            )
    return load(recipe, [*(flag_overrides or []), *overrides])


def _flags(args: argparse.Namespace, mapping: dict[str, str]) -> list[str]:
    """Turn command-line flags that were given into ``section.key=value`` overrides."""
    out = []
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out


# --------------------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------------------
# Each command imports its application module when it runs, not at the top of this file: most of them import torch
# and transformers (seconds), which `finecap config` and text-only `finecap eval` never need (tests/test_cli.py checks
# that `finecap eval --metrics bleu,rouge,cider` imports neither).


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
    }
    main(_config(args, _flags(args, flags)))


def cmd_retriever_train(args: argparse.Namespace) -> None:
    from finecap.app.retriever import main

    main(_config(args))


def cmd_retriever_probe(args: argparse.Namespace) -> None:
    from finecap.app.retriever import probe_main

    probe_main(_config(args), out=args.out)


def cmd_train(args: argparse.Namespace) -> None:
    from finecap.app.train import train

    train(_config(args), resume=args.resume)


def cmd_caption(args: argparse.Namespace) -> None:
    from finecap.app.caption import main

    recipe, overrides = _split_recipe(list(args.items))  # on top of the checkpoint's own config: only keys given
    main(checkpoint=args.checkpoint, split=args.split, out=args.out, data=args.data, recipe=recipe,
         overrides=overrides)  # fmt: skip


def cmd_eval(args: argparse.Namespace) -> None:
    from finecap.app.eval import main

    main(
        _config(args),
        predictions=args.predictions,
        references=args.references,
        images=args.images,
        bags=args.bags,
        metrics=args.metrics,
        out=args.out,
        split=args.split,
        fmt=args.format,
    )


def cmd_bags_build(args: argparse.Namespace) -> None:
    from finecap.app.bags import main

    main(_config(args), data=args.data, split=args.split, sizes=args.sizes, out=args.out)


def cmd_bags_review(args: argparse.Namespace) -> None:
    from finecap.app.review import main

    main(args.bags, args.images, data=args.data, out=args.out, host=args.host, port=args.port, token=args.token)


def cmd_report(args: argparse.Namespace) -> None:
    from finecap.app.report import main

    main(args.run_dir, args.out, items=args.items, n_sample=args.sample, n_disagree=args.disagree, n_bags=args.bags,
         retrieval=not args.no_bag_outcomes)  # fmt: skip


def cmd_demo(args: argparse.Namespace) -> None:
    from finecap.app.demo import load_demo_config, main

    recipe, items = _split_recipe(list(args.items))
    flags = []
    if args.run_dir:
        flags.append(f"run.dir={args.run_dir}")
    if args.force:
        flags.append("demo.force=true")
    if args.stages:
        flags.append(f"demo.stages=[{args.stages}]")
    items = [*flags, *items]
    main(load_demo_config(recipe, items, args.quick), items=items, quick=args.quick)


def cmd_boost(args: argparse.Namespace) -> None:
    from finecap.app.boost import main

    main(_config(args), out=args.out)


def cmd_recipes(args: argparse.Namespace) -> None:
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
    print(yaml.safe_dump(_config(args).to_dict(), sort_keys=False), end="")


# --------------------------------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------------------------------

OVERRIDES_HELP = "optional recipe YAML, then section.key=value overrides (e.g. train.lr=1e-4)"


def _add(sub: argparse._SubParsersAction, name: str, func: Callable, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help)
    p.add_argument("items", nargs="*", metavar="[RECIPE] [key=value ...]", help=OVERRIDES_HELP)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finecap", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"finecap {__import__('finecap').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    world = sub.add_parser("world", help="the embedded synthetic world").add_subparsers(dest="action", required=True)
    p = _add(world, "make", cmd_world_make, "Generate the synthetic world data set (images, captions, scene graphs).")
    p.add_argument("--out", help="output folder (world.out)")
    p.add_argument("--n-train", dest="n_train", type=int, help="training scenes (world.n_train)")
    p.add_argument("--n-val", dest="n_val", type=int, help="validation scenes (world.n_val)")
    p.add_argument("--n-test", dest="n_test", type=int, help="test scenes (world.n_test)")
    p.add_argument("--seed", type=int, help="world seed (world.seed)")
    p.add_argument("--image-size", dest="image_size", type=int, help="image side in pixels (world.image_size)")
    p.add_argument("--families", type=int, help="scene-family size, 0 = off (world.families)")

    retr = sub.add_parser("retriever", help="the CLIP retriever").add_subparsers(dest="action", required=True)
    _add(retr, "train", cmd_retriever_train, "Train (or reuse from cache) the world encoder / retriever.")
    p = _add(retr, "probe", cmd_retriever_probe, "Linear-probe and caption-retrieval checks of the world encoder.")
    p.add_argument("--out", default=None, help="JSON file for the probe results")

    p = _add(sub, "train", cmd_train, "Train a captioner with a recipe.")
    p.add_argument("--resume", action="store_true", help="continue the run from its last checkpoint")

    p = _add(sub, "caption", cmd_caption, "Caption a data split with a trained checkpoint (COCO results JSON).")
    p.add_argument("--checkpoint", required=True, help="checkpoint folder, or a run directory (its best checkpoint)")
    p.add_argument("--data", default=None, help="data set file (default: the checkpoint's data)")
    p.add_argument("--split", default="test", help="split to caption")
    p.add_argument("--out", required=True, help="output COCO results JSON")

    p = _add(sub, "eval", cmd_eval, "Evaluate captions (n-gram, CLIP, retrieval, diversity, faithfulness).")
    p.add_argument("--predictions", required=True, help="COCO results JSON")
    p.add_argument("--references", required=True, help="references (Karpathy/COCO/JSONL/world/Hugging Face data set)")
    p.add_argument("--images", default=None, help="image root for relative paths")
    p.add_argument("--bags", default=None, help="bags JSON from `finecap bags build`")
    p.add_argument("--metrics", default=None, help="comma-separated metric names (default: eval.metrics)")
    p.add_argument("--split", default=None, help="restrict references to this split")
    p.add_argument("--out", default=None, help="also write {metric: value} to this JSON file")
    p.add_argument("--format", choices=("table", "json"), default="table", help="stdout: Markdown table or JSON")

    bags = sub.add_parser("bags", help="TrueMatch-style bags").add_subparsers(dest="action", required=True)
    p = _add(bags, "build", cmd_bags_build, "Build bags of similar images (NDLB Algorithms 1-2).")
    p.add_argument("--data", default=None, help="data set file (default: the world)")
    p.add_argument("--split", default="test", help="split to build bags on")
    p.add_argument("--sizes", default="3,5,7", help="comma-separated bag sizes")
    p.add_argument("--out", required=True, help="output JSON")

    p = bags.add_parser("review", help="Accept or reject candidate bags in a local web page (saved as you click).")
    p.add_argument("bags", metavar="BAGS.json", help="candidate bags from `finecap bags build`")
    p.add_argument("--images", required=True, help="image root; only files under it are served")
    p.add_argument("--data", default=None, help="data set file for captions (default: the bags file's 'data')")
    p.add_argument("--out", default=None, help="curated bags JSON (default BAGS.curated.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (0 = any free port)")
    p.add_argument("--token", default=None, help="access token the browser must present (default "
                   "$FINECAP_REVIEW_TOKEN; generated and printed when --host is beyond loopback)")  # fmt: skip
    p.set_defaults(func=cmd_bags_review)

    p = sub.add_parser("report", help="Write a self-contained HTML report of a run directory.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (e.g. runs/demo)")
    p.add_argument("items", nargs="*", metavar="key=value", help="overrides of the run's config.yaml")
    p.add_argument("--out", default=None, help="output HTML (default RUN_DIR/report.html)")
    p.add_argument("--sample", type=int, default=8, help="random images in the caption gallery")
    p.add_argument("--disagree", type=int, default=8, help="images where stages disagree most in the gallery")
    p.add_argument("--bags", type=int, default=3, help="bags of each size in the bag gallery")
    p.add_argument(
        "--no-bag-outcomes",
        dest="no_bag_outcomes",
        action="store_true",
        help="skip the bag gallery (it loads the retriever)",
    )
    p.set_defaults(func=cmd_report)

    p = _add(sub, "demo", cmd_demo, "Run the whole pipeline on the embedded world and print the results table.")
    p.add_argument("--quick", action="store_true", help="tiny settings (about two minutes)")
    p.add_argument("--run-dir", dest="run_dir", default=None, help="run directory (default runs/demo)")
    p.add_argument("--force", action="store_true", help="re-run stages whose outputs exist")
    p.add_argument("--stages", default=None, help="comma-separated stages to run (default demo.stages)")

    p = _add(
        sub,
        "boost",
        cmd_boost,
        "Visual Caption Boosting: rewrite a data set's captions (BlendCap/VisualCap/HolisticCap).",
    )
    p.add_argument("--out", required=True, help="output folder (resumable: re-run with the same --out)")

    p = sub.add_parser("recipes", help="List the packaged recipes (run one with `finecap train NAME`).")
    p.set_defaults(func=cmd_recipes)

    p = _add(sub, "config", cmd_config, "Print the resolved configuration (or all keys with --describe).")
    p.add_argument("--describe", action="store_true", help="list every key with its type, default and doc")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        # Configuration and data errors carry a message naming the key, file or record at fault; print it
        # without a traceback (set FINECAP_DEBUG=1 to see one).
        if os.environ.get("FINECAP_DEBUG"):
            raise
        print(f"finecap: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
