"""The GPU decode's Lightning adapter (``callbacks/_gpu_decode.py``) under DDP: real gloo processes."""

from __future__ import annotations

import pytest

from tests.helpers import run_ddp


def test_ddp_ranks_run_one_search_and_time_a_share_only_where_every_rank_shows_it(tmp_path):
    """2 x H200, ResNet-50: with each rank's own share in rank 0's window, share 1 read 8.95 batches/s where the
    GPU decode then trained at 14.9 per rank. Here rank 1's batches show a new share 5 batches after rank 0's, and
    the ranks step together at the slower rank's pace: every rank reaches the same decision, and each share's
    rate is its own (the old windows read share 1 at 13.6 batches/s, not 16)."""
    results = run_ddp(
        """
        import os
        from types import SimpleNamespace

        import torch.distributed as dist

        import lightning_gpu_boost.callbacks._gpu_decode as adapter
        from lightning_gpu_boost.core.gpu_decode import SplitSearch

        rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=NPROCS)
        dist.get_backend = lambda group=None: "nccl"  # as under DDP on GPUs: the search makes a gloo group
        stage = adapter.GPUDecodeStage("auto")
        stage.search = SplitSearch(window=10, settle=2 + rank)  # the ranks' workers counted apart: settle 3 for both
        stage._taken = {"a loader": None}
        lags, history, clock = [2, 7], [0.0] * 8, [0.0]  # batches until a rank's batches show a new share

        def rate(share):
            return 10.0 if share == 0.0 else 16.0 if share == 1.0 else 13.0

        stage._last_batch = lambda: (history[-lags[rank]], None, None, None)
        adapter.time = SimpleNamespace(monotonic=lambda: clock[0])
        trainer = SimpleNamespace(world_size=NPROCS, global_rank=rank, strategy=None)
        for _ in range(3000):
            clock[0] += max(1.0 / rate(history[-lag]) for lag in lags)  # the slower rank sets the pace
            proposal, decided = stage._search_step(trainer)
            history.append(proposal if proposal is not None else history[-1])
            if decided is not None:
                break
        made_group = stage._group is not None and stage._group is not dist.group.WORLD
        stage._drop_group()
        (OUT / f"rank{rank}.json").write_text(json.dumps({"share": decided.share, "why": decided.why,
            "settle": stage.search.settle, "made_group": made_group, "group_left": stage._group is not None,
            "rates": {str(k): v for k, v in decided.rates.items()}, "windows": decided.windows}))
        """,
        tmp_path,
    )
    assert results[0] == results[1] and results[0]["settle"] == 3
    assert results[0]["made_group"] and not results[0]["group_left"]
    assert results[0]["share"] == 1.0, results[0]["why"]
    assert abs(results[0]["rates"]["1.0"] - 16.0) < 1e-6 and abs(results[0]["rates"]["0.0"] - 10.0) < 1e-6


def test_ddp_ranks_decide_one_placement_in_a_real_fit(tmp_path):
    """StreamPrefetch(decode="auto") in a 2-rank gloo DDP fit of torchvision's ImageFolder: both ranks reach the same
    placement, and the ranks together see every sample once per epoch while the workers' share changes; each rank's
    workers leave CPUs for both ranks during a split."""
    pytest.importorskip("torchvision")
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "tree", n=48, num_classes=2, progress=False, size_range=(90, 120, 70, 100))
    results = run_ddp(
        f"""
        import lightning.pytorch as pl
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms as T

        from lightning_gpu_boost.callbacks import StreamPrefetch

        class Probe(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)
                self.seen = []

            def on_train_epoch_start(self):
                self.seen.append([])

            def training_step(self, batch, i):
                self.seen[-1] += batch[1].tolist()
                self.processes = self.trainer.train_dataloader.dataset.transform._cpus.processes
                return self.layer(batch[0].mean().view(1, 1)).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.0)

        transform = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                               T.Normalize([0.5] * 3, [0.25] * 3)])
        loader = DataLoader(datasets.ImageFolder({str(root)!r}, transform=transform), batch_size=1, shuffle=True,
                            num_workers=1, persistent_workers=True)
        prefetch = StreamPrefetch(decode="auto", cpu_lookahead=True)
        model = Probe()
        trainer = pl.Trainer(max_epochs=16, accelerator="cpu", devices=NPROCS, strategy="ddp", logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[prefetch])
        trainer.fit(model, loader)
        placement = prefetch.decode_placement
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps({{"share": placement["share"],
            "why": placement["why"], "seen": model.seen,
            "processes": model.processes}}))
        """,
        tmp_path,
        timeout=400,
    )
    assert results[0]["share"] == results[1]["share"] and results[0]["why"] == results[1]["why"]
    assert "measuring" not in results[0]["why"], results[0]["why"]
    assert results[0]["processes"] == results[1]["processes"] == 2
    for epoch in zip(results[0]["seen"], results[1]["seen"], strict=True):
        assert sorted(epoch[0] + epoch[1]) == [0] * 24 + [1] * 24


def _run_stage(monkeypatch, device, cpu, engines, cuda):
    """A GPUDecodeStage("auto") with a train and a validation decoder (DALI on ``device``) stepped until it places
    the decode for good, each batch made and decoded under the share and engine load set 4 batches earlier, trained
    at ``cpu``, ``engines`` or ``cuda`` batches/s; the stage, its decoders and what it set (share, why, final)."""
    from types import SimpleNamespace

    import lightning_gpu_boost.callbacks._gpu_decode as adapter
    from lightning_gpu_boost.core.gpu_decode import SplitSearch

    stage = adapter.GPUDecodeStage("auto")
    stage.search = SplitSearch(window=10, settle=2)
    decoders = [SimpleNamespace(engine_load=None, _dali=True, device=SimpleNamespace(type=device)) for _ in "tv"]
    stage._taken = {"train loader": (None, "train", None), "val loader": (None, "validate", None)}
    stage._decoders = dict(zip(stage._taken, decoders, strict=True))
    said = []

    def set_share(share, why, final=False):
        stage.share, stage.why = share, why
        said.append((share, why, final))

    stage._set = set_share
    monkeypatch.setattr(adapter, "data_path", lambda trainer: SimpleNamespace(
        choices=SimpleNamespace(choose=lambda *a, **k: None)))
    monkeypatch.setattr(adapter, "rank_zero_info", lambda message: None)
    clock = [0.0]
    monkeypatch.setattr(adapter, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    history = [(0.0, None)] * 4  # (share, engine load) the batches were made and decoded under, 4 batches late
    trainer = SimpleNamespace(world_size=1, global_rank=0)
    for _ in range(3000):
        share, load = history[-4]
        clock[0] += 1.0 / (cpu if share == 0.0 else cuda if load == 0.0 else engines)
        stage._last_batch = lambda share=share, load=load: (share, None, None, load if share > 0 else None)
        stage.on_train_batch_end(trainer)
        history.append((stage.share, 1.0 if decoders[0].engine_load is None else decoders[0].engine_load))
        if said and said[-1][2]:
            break
    return stage, decoders, said


@pytest.mark.parametrize(("cuda_rate", "device", "kept"), [(18.0, "cuda", 0.0), (16.2, "cuda", 0.0),
                                                            (15.6, "cuda", 1.0), (18.0, "cpu", None)])  # fmt: skip
def test_auto_times_the_cuda_decoder_after_placing_a_gpu_share_that_dali_decodes(monkeypatch, cuda_rate, device,
                                                                                 kept):  # fmt: skip
    """decode="auto" places the share first (the JPEG engines decoding it), then times nvJPEG's CUDA decoder in
    their place and keeps it where it trains at least as fast (each one's slower window); every decoder is left at
    the load kept.
    Where DALI does not decode on a GPU, nothing more is timed."""
    stage, decoders, said = _run_stage(monkeypatch, device, cpu=10.0, engines=16.0, cuda=cuda_rate)
    decision = stage.decision
    assert decision is not None and decision.share == 1.0 and said[-1] == (1.0, decision.why, True)
    assert decision.engine_load == kept and all(d.engine_load == kept for d in decoders)
    assert (stage.choice is None) == (kept is None)
    if kept == 0.0:
        assert "nvJPEG's CUDA decoder decodes in place of the JPEG engines" in decision.why
        assert any(why == "measuring: nvJPEG's CUDA decoder in place of the JPEG engines" for _, why, _ in said)
    elif kept == 1.0:
        assert "the JPEG engines are kept" in decision.why


@pytest.mark.parametrize("rank1_dali", [True, False])
def test_ddp_ranks_time_the_cuda_decoder_on_the_same_figures_and_keep_one_decoder(tmp_path, rank1_dali):
    """Under DDP the decoder's choice goes through the same gloo gathering as the split search, each batch showing
    the engine load it was decoded with: rank 1's batches show the CUDA decoder 3 batches after rank 0's, and both
    ranks keep it (18 batches/s against the engines' 16), every decoder of each rank at load 0. Where one rank's
    batches are not decoded by DALI, no rank times the choice (a rank timing it alone would wait for the others)."""
    results = run_ddp(
        """
        import os
        from types import SimpleNamespace

        import torch.distributed as dist

        import lightning_gpu_boost.callbacks._gpu_decode as adapter
        from lightning_gpu_boost.core.gpu_decode import SplitSearch

        rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=NPROCS)
        stage = adapter.GPUDecodeStage("auto")
        stage.search = SplitSearch(window=10, settle=3)
        decoder = SimpleNamespace(engine_load=None, _dali=rank == 0 or RANK1_DALI, device=SimpleNamespace(type="cuda"))
        stage._taken = {"train loader": (None, "train", None)}
        stage._decoders = {"train loader": decoder}
        said = []

        def set_share(share, why, final=False):
            stage.share = share
            said.append((share, why, final))

        stage._set = set_share
        adapter.data_path = lambda trainer: SimpleNamespace(choices=SimpleNamespace(choose=lambda *a, **k: None))
        adapter.rank_zero_info = lambda message: None
        clock = [0.0]
        adapter.time = SimpleNamespace(monotonic=lambda: clock[0])
        lags = [2, 5]
        history = [(0.0, None)] * 8

        def rate(share, load):
            return 10.0 if share == 0.0 else 18.0 if load == 0.0 else 16.0

        trainer = SimpleNamespace(world_size=NPROCS, global_rank=rank, strategy=None)
        for _ in range(4000):
            clock[0] += max(1.0 / rate(*history[-lag]) for lag in lags)  # the slower rank sets the pace
            share, load = history[-lags[rank]]
            stage._last_batch = lambda share=share, load=load: (share, None, None, load if share > 0 else None)
            stage.on_train_batch_end(trainer)
            history.append((stage.share, 1.0 if decoder.engine_load is None else decoder.engine_load))
            if said and said[-1][2]:
                break
        stage._drop_group()
        decision = stage.decision
        (OUT / f"rank{rank}.json").write_text(json.dumps({"share": decision.share, "why": decision.why,
            "engine_load": decision.engine_load, "decoder_load": decoder.engine_load,
            "timed": [w for w in decision.windows if "engine_load" in w]}))
        """.replace("RANK1_DALI", repr(rank1_dali)),
        tmp_path,
    )
    assert results[0] == results[1], results
    if not rank1_dali:
        assert results[0]["engine_load"] is None and results[0]["decoder_load"] is None and not results[0]["timed"]
        return
    assert results[0]["share"] == 1.0 and results[0]["engine_load"] == 0.0 == results[0]["decoder_load"]
    assert "nvJPEG's CUDA decoder decodes in place of the JPEG engines" in results[0]["why"]
    assert "(18.00 against 16.00)" in results[0]["why"]
    assert len(results[0]["timed"]) == 2


@pytest.mark.parametrize(("cuda_rate", "device", "share"), [(18.5, "cuda", 1.0), (17.3, "cuda", 0.0),
                                                             (18.5, "cpu", 0.0)])  # fmt: skip
def test_auto_times_the_cuda_decoder_against_a_kept_cpu_decode(monkeypatch, cuda_rate, device, share):
    """Where the search keeps the CPU decode (17 batches/s against the JPEG engines' 16.6) and DALI decodes on a GPU,
    nvJPEG's CUDA decoder decoding every sample is timed too (H200, ResNet-50: 0.984 of the ceiling, the engines
    0.91-0.92) and placed only where it beats the CPU decode by the margin; else the CPU decode stays, the decoders
    at DALI's default load. Without DALI on a GPU the CPU decode is kept at once."""
    stage, decoders, said = _run_stage(monkeypatch, device, cpu=17.0, engines=16.6, cuda=cuda_rate)
    decision = stage.decision
    assert decision is not None and decision.share == share and said[-1] == (share, decision.why, True)
    assert decision.why.startswith("the CPU decode is kept" if share == 0.0 else "the GPU decodes 100% of the samples")
    if device == "cpu":
        assert stage.choice is None and all(d.engine_load is None for d in decoders)
        return
    assert any(why == "measuring: nvJPEG's CUDA decoder decoding every sample" for _, why, _ in said)
    assert len([w for w in decision.windows if "engine_load" in w]) == 2
    if share == 1.0:
        assert decision.engine_load == 0.0 and all(d.engine_load == 0.0 for d in decoders)
        assert "nvJPEG's CUDA decoder decodes them: 1.09x the CPU decode's" in decision.why
    else:
        assert decision.engine_load is None and all(d.engine_load is None for d in decoders)
        assert "nvJPEG's CUDA decoder decoding every sample trained at 1.02x the CPU decode's" in decision.why
