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

__all__ = ['add_arguments', 'build', 'load_class', 'run']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="the DataModule's class path, e.g. my_project.data.MyDataModule")
    parser.add_argument("--data-args", default="{}", help="its init arguments as JSON")
    parser.add_argument("--model", help="the LightningModule's class path (optional: without it, data only)")
    parser.add_argument("--model-args", default="{}", help="its init arguments as JSON")
    parser.add_argument("--config", help="a LightningCLI YAML config with `data:` (and `model:`) sections")
    parser.add_argument("--precision", help="Trainer precision for the step, e.g. bf16-mixed")
    parser.add_argument("--accelerator", default="auto", help="Trainer accelerator for the step")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds for the loader measurements")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps on a resident batch")
    parser.add_argument("--no-tune", action="store_true", help="skip the worker-count search")
    parser.add_argument("--out", help="also write <out>/doctor-<date>-<gpu>.json (the measurements)")
    parser.set_defaults(func=run)


def load_class(path: str) -> type:
    """``package.module.Class`` -> the class, with an error that names what is missing."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise SystemExit(f"{path!r} is not a class path: expected package.module.ClassName.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SystemExit(f"Cannot import {module_name!r} for {path!r}: {err}.") from err
    if not hasattr(module, name):
        raise SystemExit(f"{module_name!r} has no {name!r}.")
    return getattr(module, name)


def _section(config: dict[str, Any], key: str) -> tuple[str | None, dict[str, Any]]:
    value = config.get(key)
    if value is None:
        return None, {}
    if isinstance(value, str):
        return value, {}
    return value.get("class_path"), dict(value.get("init_args") or {})


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """The DataModule and the LightningModule (or ``None``) that ``args`` name."""
    data_path, model_path = args.data, args.model
    data_args, model_args = json.loads(args.data_args), json.loads(args.model_args)
    if args.config:
        import yaml

        with open(args.config) as f:
            config = yaml.safe_load(f) or {}
        config_data, config_data_args = _section(config, "data")
        config_model, config_model_args = _section(config, "model")
        data_path, data_args = data_path or config_data, {**config_data_args, **data_args}
        model_path, model_args = model_path or config_model, {**config_model_args, **model_args}
    if not data_path:
        raise SystemExit(
            "Name the DataModule: --data package.module.Class, or --config with a `data:` section."
        )
    datamodule = load_class(data_path)(**data_args)
    model = load_class(model_path)(**model_args) if model_path else None
    return datamodule, model


def run(args: argparse.Namespace) -> int:
    from lightning_gpu_boost.doctor import diagnose

    datamodule, model = build(args)
    trainer_kwargs: dict[str, Any] = {"accelerator": args.accelerator}
    if args.precision:
        trainer_kwargs["precision"] = args.precision

    def progress(line: str) -> None:
        print(f"doctor: {line}", file=sys.stderr, flush=True)

    diagnosis = diagnose(datamodule, model, budget_s=args.budget, steps=args.steps, tune=not args.no_tune,
                         progress=progress, **trainer_kwargs)  # fmt: skip
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
