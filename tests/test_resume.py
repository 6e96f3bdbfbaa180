"""Exact resume: every loader the package makes or wraps, resumed from a checkpoint after every step and after every
validation of a 3-epoch run, repeats and skips no sample, on one process and under 2-process DDP (gloo).

The counts are printed in pytest's summary ("resume harness")."""

from __future__ import annotations

import importlib.util

import pytest

from tests.resume_harness import CASES, EPOCHS, USER_CASES, make_data, resume_counts

pytestmark = pytest.mark.filterwarnings("ignore:.*bad (train|val) samples", "ignore:.*across ranks is zero")

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


@pytest.fixture(scope="module")
def resume_data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("resume-data"))


def _check(out: dict, report) -> None:
    report(f"{out['case']}: {out['resumes']} resumes, {out['repeated']} repeated, {out['skipped']} skipped, "
           f"{out['wrong_order']} in another order, {out['wrong_values']} with other values")  # fmt: skip
    assert out["resumes"] >= 3 * EPOCHS, out
    assert (out["repeated"], out["skipped"], out["wrong_order"], out["wrong_values"]) == (0, 0, 0, 0), out["failures"][:2]


@pytest.mark.parametrize("name", CASES)
def test_a_run_resumed_from_any_step_sees_exactly_the_uninterrupted_batches(name, resume_data, tmp_path,
                                                                            resume_report):  # fmt: skip
    if name.startswith("dali") and not HAS_DALI:
        pytest.skip("needs nvidia-dali")
    _check(resume_counts(name, resume_data, tmp_path, accelerator="cpu", devices=1), resume_report)


@pytest.mark.parametrize("name", USER_CASES)
def test_the_users_own_loader_resumed_from_any_step_sees_exactly_the_uninterrupted_batches(name, resume_data, tmp_path,
                                                                                           resume_report):  # fmt: skip
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check(resume_counts(name, resume_data, tmp_path, accelerator="cpu", devices=1), resume_report)
    assert not [w for w in caught if "not resumable" in str(w.message)]  # exact: Lightning has nothing to warn of


def test_ddp_runs_resumed_from_any_step_see_exactly_the_uninterrupted_batches(resume_data, tmp_path, resume_report):
    from tests.helpers import run_ddp

    cases = [c for c in CASES if HAS_DALI or not c.startswith("dali")] + list(USER_CASES)
    data = {k: str(v) for k, v in resume_data.items()}
    script = f"""
        import logging, warnings
        import tests.resume_harness as harness
        from tests.resume_harness import resume_counts
        harness.start_forkserver_by_fork()
        harness.WORKER_CONTEXT = "forkserver"
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")
        data = {{k: Path(v) for k, v in {data!r}.items()}}
        results = []
        for name in {cases!r}:
            out = resume_counts(name, data, OUT / "work", accelerator="cpu", devices=NPROCS, strategy="ddp")
            results.append(out)
        import torch.distributed as dist
        (OUT / f"rank{{dist.get_rank()}}.json").write_text(json.dumps(results))
        """
    ranks = run_ddp(script, tmp_path, timeout=900)
    for rank, results in enumerate(ranks):
        for out in results:
            out["case"] = f"{out['case']} (DDP rank {rank})"
            _check(out, resume_report)


def test_an_iterable_dataset_says_once_that_its_epoch_restarts():
    import torch
    from torch.utils.data import IterableDataset

    from lightning_gpu_boost.core.resume import ResumableDataLoader

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(8))

        def __len__(self):
            return 8

    loader = ResumableDataLoader(Stream(), batch_size=2)
    loader.load_state_dict({"epoch": None, "batches": 2})
    with pytest.warns(UserWarning, match="cannot be started where the checkpoint was"):
        batches = [b.tolist() for b in loader]
    assert batches[0] == [0, 1] and len(batches) == 4


@pytest.mark.parametrize("part", ["gpu_boost", "span_epochs", "auto_workers"])
def test_a_stateful_loader_resumed_with_another_worker_count_is_refused_naming_both(part, tmp_path):
    pytest.importorskip("torchdata")
    import lightning.pytorch as pl
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_gpu_boost.callbacks import AutoNumWorkers, GPUBoost, SpanEpochs
    from tests.helpers import IndexDataset
    from tests.resume_harness import IdModel

    parts = {"gpu_boost": lambda: GPUBoost(auto_workers=False, watchdog=False), "span_epochs": SpanEpochs,
             "auto_workers": lambda: AutoNumWorkers(workers_budget_s=1.0, use_cache=False, max_workers=2)}  # fmt: skip

    def fit(workers, ckpt=None, save=None):
        loader = StatefulDataLoader(IndexDataset(14), batch_size=4, num_workers=workers, shuffle=True)
        every = [pl.callbacks.ModelCheckpoint(dirpath=save, every_n_train_steps=1, save_top_k=-1, filename="{step}")]
        model = IdModel()
        pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, callbacks=[parts[part](), *(every if save else [])],
                   logger=False, enable_checkpointing=bool(save), enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=str(tmp_path)).fit(model, train_dataloaders=loader, ckpt_path=ckpt)  # fmt: skip
        return model

    whole = fit(2, save=tmp_path / "ckpt")
    assert fit(2, ckpt=str(tmp_path / "ckpt" / "step=2.ckpt")).steps == whole.steps[2:]  # same count: exact
    with pytest.raises(ValueError, match=r"StatefulDataLoader saved it with num_workers=2 and this run has "
                                         r"num_workers=1 .* Resume with num_workers=2"):  # fmt: skip
        fit(1, ckpt=str(tmp_path / "ckpt" / "step=2.ckpt"))
