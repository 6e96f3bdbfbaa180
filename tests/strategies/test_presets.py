from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import cli as lightning_cli
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

import lightning_gpu_boost  # noqa: F401  (registers ddp_boost)
from lightning_gpu_boost.strategies import DDPBoostStrategy, recommended_precision
from tests.helpers import run_ddp

#: Lightning's own check for what LightningCLI needs (a test dependency here, missing on the GPU machine's image)
CLI_AVAILABLE = bool(getattr(lightning_cli, "_JSONARGPARSE_SIGNATURES_AVAILABLE", True))

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "examples" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", ["ddp_boost", "ddp_boost_static", "ddp_boost_bf16"])
def test_registered_names_resolve(name):
    trainer = pl.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, DDPBoostStrategy)
    kwargs = trainer.strategy._ddp_kwargs
    # buffers are not synced before every forward, under the name this torch takes (2.13 deprecates the old one)
    sync = kwargs.get("forward_sync_buffers", kwargs.get("broadcast_buffers"))
    assert kwargs["gradient_as_bucket_view"] is True and sync is False
    assert not ("forward_sync_buffers" in kwargs and "broadcast_buffers" in kwargs)
    assert kwargs["static_graph"] is (name == "ddp_boost_static")


def test_bad_arguments():
    with pytest.raises(ValueError, match="gradient_compression must be one of 'none', 'bf16', 'fp16', got 'int8'"):
        DDPBoostStrategy(gradient_compression="int8")
    with pytest.raises(ValueError, match="bucket_cap_mb must be a number > 0, got 0"):
        DDPBoostStrategy(bucket_cap_mb=0)
    with pytest.raises(ValueError, match="bucket_cap_mb must be a number > 0, got '25'"):
        DDPBoostStrategy(bucket_cap_mb="25")
    with pytest.raises(ValueError, match="broadcast_buffers must be True or False, got 2"):
        DDPBoostStrategy(broadcast_buffers=2)
    with pytest.raises(ValueError, match="process_group_backend must be one of .*'gloo'.*got 'bogus'"):
        DDPBoostStrategy(process_group_backend="bogus")


def test_recommended_precision_on_cpu():
    assert recommended_precision("cpu") == "32-true"


def test_ddp_boost_trains_and_checkpoints_over_gloo(tmp_path):
    results = run_ddp(
        f"""
        import torch
        import lightning.pytorch as pl
        import lightning_gpu_boost
        from torch.utils.data import DataLoader
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp_boost", max_epochs=2, logger=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir={str(tmp_path)!r})
        model = RecordingModel()
        trainer.fit(model, DataLoader(IndexDataset(32), batch_size=4, shuffle=True))
        ckpt = trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path
        if not ckpt:
            ckpt = str(next(Path({str(tmp_path)!r}).rglob("*.ckpt")))
        weights = torch.load(ckpt, weights_only=False)["state_dict"]["layer.weight"]
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps({{
            "strategy": type(trainer.strategy).__name__, "steps": trainer.global_step,
            "weights": model.layer.weight.tolist(), "ckpt_weights": weights.tolist(),
            "ids": sorted(sum(model.seen["train"][:4], []))}}))
        """,
        tmp_path,
        launcher="lightning",  # `python train.py` as users run it: the Trainer starts the other rank itself
    )
    assert {r["strategy"] for r in results} == {"DDPBoostStrategy"}
    assert results[0]["steps"] == results[1]["steps"] == 8
    assert results[0]["weights"] == results[1]["weights"] == results[0]["ckpt_weights"]  # synchronized, saved
    assert set(results[0]["ids"]).isdisjoint(results[1]["ids"])


def test_backend_settings_round_trip():
    from lightning_gpu_boost.strategies.presets import backend_settings, configure_backends, restore_backends

    found = backend_settings()
    try:
        configure_backends(tf32=True, cudnn_benchmark=True)
        assert torch.backends.cudnn.benchmark and torch.get_float32_matmul_precision() == "high"
    finally:
        restore_backends(found)
    assert backend_settings() == found


@pytest.mark.skipif(not CLI_AVAILABLE, reason="LightningCLI needs jsonargparse[signatures] (the GPU machine lacks it)")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_yaml_config_builds_and_fits(config, tmp_path):
    cli = LightningCLI(
        BoringModel,
        BoringDataModule,
        args=[
            "fit",
            "--config",
            str(config),
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.precision=32-true",
            "--trainer.max_steps=3",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],  # fmt: skip
        save_config_kwargs={"overwrite": True},
    )
    assert cli.trainer.global_step == 3


@pytest.mark.gpu
def test_bf16_is_recommended_on_hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("not a Hopper GPU")
    assert recommended_precision() == "bf16-mixed"


@pytest.mark.gpu
def test_compression_hook_registers_on_nccl(tmp_path):
    seen = {}

    class Spy(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["backend"] = trainer.strategy.process_group_backend
            seen["hook"] = str(trainer.strategy.model._get_ddp_logging_data().get("comm_hook"))

    trainer = pl.Trainer(strategy="ddp_boost_bf16", accelerator="gpu", devices=1, max_steps=2, logger=False,
                         callbacks=[Spy()], enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(BoringModel())
    assert seen["backend"] == "nccl" and "bf16_compress_hook" in seen["hook"], seen


@pytest.mark.skipif(not CLI_AVAILABLE, reason="LightningCLI needs jsonargparse[signatures] (the GPU machine lacks it)")
def test_the_preset_builds_from_yaml_in_a_script_that_never_imports_the_package(tmp_path):
    """A user's LightningCLI script with only Lightning imports: the class path in the YAML is enough."""

    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "ddp_boost.yaml"
    script = (
        "import sys\n"
        "from lightning.pytorch.cli import LightningCLI\n"
        "from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel\n"
        "assert 'lightning_gpu_boost' not in sys.modules\n"
        f"cli = LightningCLI(BoringModel, BoringDataModule, args=['fit', '--config', {str(config)!r}, "
        "'--trainer.accelerator=cpu', '--trainer.devices=1', '--trainer.max_steps=2', '--trainer.logger=false', "
        f"'--trainer.enable_checkpointing=false', '--trainer.enable_progress_bar=false', "
        f"'--trainer.default_root_dir={tmp_path}'])\n"
        "print(type(cli.trainer.strategy).__name__)\n"
    )
    import os

    from tests.helpers import _DIST_VARS, ROOT

    # an in-process DDP Trainer of an earlier test leaves LOCAL_RANK & co. behind: not for this fresh process
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith(("PL_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    from tests.fresh_python import run_fresh  # a process that has imported neither Lightning nor the package

    status, output = run_fresh(script, cwd=tmp_path, env=env, timeout=120)
    assert status == 0, output[-3000:]
    assert output.strip().splitlines()[-1] == "DDPBoostStrategy"
