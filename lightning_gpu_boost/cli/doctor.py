"""``lightning-gpu-boost doctor``: where your training time goes, and what to change.

    lightning-gpu-boost doctor --data my_project.data.MyDataModule --data-args '{"batch_size": 256}' \\
        --model my_project.model.MyModel --precision bf16-mixed
    lightning-gpu-boost doctor --config config.yaml      # a LightningCLI config with `data:` and `model:`
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from lightning_gpu_boost.cli._args import at_least, positive_float, writable_folder

__all__ = ['add_arguments', 'build', 'check_trainer_args', 'load_class', 'run']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="the DataModule's class path, e.g. my_project.data.MyDataModule")
    parser.add_argument("--data-args", default="{}", help="its init arguments as JSON")
    parser.add_argument("--model", help="the LightningModule's class path (optional: without it, data only)")
    parser.add_argument("--model-args", default="{}", help="its init arguments as JSON")
    parser.add_argument("--config", help="a LightningCLI YAML config with `data:` (and `model:`) sections")
    parser.add_argument("--precision", help="Trainer precision for the step, e.g. bf16-mixed")
    parser.add_argument("--accelerator", default="auto", help="Trainer accelerator for the step")
    parser.add_argument("--budget", type=positive_float, default=20.0, help="seconds for the loader measurements")
    parser.add_argument("--steps", type=at_least(1), default=10, help="timed training steps on a resident batch")
    parser.add_argument("--no-tune", action="store_true", help="skip the worker-count search")
    parser.add_argument("--no-cache", action="store_true",
                        help="search the worker count again instead of reading AutoNumWorkers' cache, and do not "
                        "write it (by default the search is AutoNumWorkers' own: the count advised is the count "
                        "AutoNumWorkers() then applies)")  # fmt: skip
    parser.add_argument("--no-trials", action="store_true",
                        help="skip the two short fits of the model that measure an advised worker count")  # fmt: skip
    parser.add_argument("--out", help="also write <out>/doctor-<date>-<gpu>.json (the measurements)")
    parser.set_defaults(func=run)


def _split_class_path(path: str) -> tuple[str, str]:
    """``package.module.Class`` -> ``("package.module", "Class")``, or one line saying it is not a class path."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise SystemExit(f"{path!r} is not a class path: expected package.module.ClassName.")
    return module_name, name


def load_class(path: str) -> type:
    """``package.module.Class`` -> the class, with an error that names what is missing. Modules are found from the
    current folder too, as ``python -m`` finds them (the console script alone would not)."""
    module_name, name = _split_class_path(path)
    import os

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SystemExit(f"Cannot import {module_name!r} for {path!r}: {err}.") from err
    if not hasattr(module, name):
        raise SystemExit(f"{module_name!r} has no {name!r}.")
    return getattr(module, name)


#: LightningCLI's subcommands: a config may hold the sections under one of them
_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _sections(config: Any) -> dict[str, Any]:
    """The config's top level, or its subcommand's (``fit:``...) where the sections sit under one."""
    if not isinstance(config, dict):
        return {}
    if "data" not in config and "model" not in config:
        for name in _SUBCOMMANDS:
            if isinstance(config.get(name), dict):
                return config[name]
    return config


def _section(config: dict[str, Any], key: str) -> tuple[str | None, dict[str, Any]]:
    """``(class path, init args)`` of a section in any form LightningCLI writes: a class path, ``class_path`` with
    ``init_args``, or the init args alone (the class fixed in the script: ``LightningCLI(Model, DataModule)``)."""
    value = config.get(key)
    if value is None:
        return None, {}
    if isinstance(value, str):
        return value, {}
    if "class_path" in value:
        return value.get("class_path"), dict(value.get("init_args") or {})
    return None, dict(value)


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{option} must be a JSON object such as '{{\"batch_size\": 64}}', got {text!r} ({err.msg}).") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{option} must be a JSON object such as '{{\"batch_size\": 64}}', got {text!r}.")
    return value


def _make(option: str, path: str, kwargs: dict[str, Any], kind: str) -> Any:
    """``path``'s class built with ``kwargs``, checked to be a Lightning ``kind``."""
    import lightning.pytorch as pl

    cls = load_class(path)
    want = pl.LightningDataModule if kind == "data" else pl.LightningModule
    if isinstance(cls, type) and not issubclass(cls, want):
        other = "a LightningModule: pass it as --model" if issubclass(cls, pl.LightningModule) else (
            "a LightningDataModule: pass it as --data" if issubclass(cls, pl.LightningDataModule) else "neither")
        raise SystemExit(f"{option} {path} must be a {want.__name__}; it is {other}.")
    try:
        obj = cls(**kwargs)
    except TypeError as err:
        args_option = "--data-args" if kind == "data" else "--model-args"
        raise SystemExit(f"{args_option} {json.dumps(kwargs)} do not fit {path}: {err}.") from None
    if not isinstance(obj, want):
        raise SystemExit(f"{option} {path} must give a {want.__name__}, got {type(obj).__name__}.")
    return obj


def check_trainer_args(args: argparse.Namespace) -> None:
    """``--precision`` and ``--accelerator`` as Lightning takes them, and a GPU where one is asked for, checked
    before any measurement."""
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    if args.precision is not None:
        valid = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS)]
        if args.precision not in valid:
            raise SystemExit(f"--precision must be one of {', '.join(valid)}, got {args.precision!r}.")
    accelerators = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
    if args.accelerator not in accelerators:
        raise SystemExit(f"--accelerator must be one of {', '.join(accelerators)}, got {args.accelerator!r}.")
    if args.accelerator in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--accelerator {args.accelerator} asks for a CUDA GPU and this machine has none "
                             "(torch.cuda.is_available() is False); use --accelerator cpu or auto.")  # fmt: skip


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """The DataModule and the LightningModule (or ``None``) that ``args`` name."""
    data_path, model_path = args.data, args.model
    data_args, model_args = _json_object("--data-args", args.data_args), _json_object("--model-args", args.model_args)
    if args.config:
        import yaml

        with open(args.config) as f:
            config = _sections(yaml.safe_load(f) or {})
        config_data, config_data_args = _section(config, "data")
        config_model, config_model_args = _section(config, "model")
        for option, named, section in (("--data", data_path or config_data, "data"),
                                       ("--model", model_path or config_model, "model")):  # fmt: skip
            if not named and config.get(section):
                raise SystemExit(f"The config's `{section}:` section holds arguments but no class (LightningCLI writes "
                                 f"it so when the script fixes the class): name it with {option} package.module.Class.")
        data_path, data_args = data_path or config_data, {**config_data_args, **data_args}
        model_path, model_args = model_path or config_model, {**config_model_args, **model_args}
    if not data_path:
        raise SystemExit(
            "Name the DataModule: --data package.module.Class, or --config with a `data:` section."
        )
    datamodule = _make("--data", data_path, data_args, "data")
    model = _make("--model", model_path, model_args, "model") if model_path else None
    return datamodule, model


def run(args: argparse.Namespace) -> int:
    for path in filter(None, (args.data, args.model)):  # before anything heavy is imported: reported at once
        _split_class_path(path)
    from lightning_gpu_boost.doctor import diagnose

    check_trainer_args(args)
    if args.out:
        writable_folder("--out", args.out)
    datamodule, model = build(args)
    trainer_kwargs: dict[str, Any] = {"accelerator": args.accelerator}
    if args.precision:
        trainer_kwargs["precision"] = args.precision

    def progress(line: str) -> None:
        print(f"doctor: {line}", file=sys.stderr, flush=True)

    diagnosis = diagnose(datamodule, model, budget_s=args.budget, steps=args.steps, tune=not args.no_tune,
                         trials=not args.no_trials, use_cache=not args.no_cache, progress=progress,
                         **trainer_kwargs)  # fmt: skip
    print(diagnosis.format())
    if args.out:
        from pathlib import Path

        from lightning_gpu_boost.core.results import environment, gpu_tag

        env = environment()
        path = Path(args.out) / f"doctor-{env['date']}-{gpu_tag()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"environment": env, "diagnosis": diagnosis.as_dict()}, indent=2))
        print(f"wrote {path}", file=sys.stderr)
    return 0
