"""The GPU decode's Lightning adapter (``callbacks/_gpu_decode.py``) under DDP: real gloo processes."""

from __future__ import annotations

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
        stage = adapter.GPUDecodeStage("auto")
        stage.search = SplitSearch(window=10, settle=2)
        stage._taken = {"a loader": None}
        lags, history, clock = [2, 7], [0.0] * 8, [0.0]  # batches until a rank's batches show a new share

        def rate(share):
            return 10.0 if share == 0.0 else 16.0 if share == 1.0 else 13.0

        stage._last_batch = lambda: (history[-lags[rank]], None, None)
        adapter.time = SimpleNamespace(monotonic=lambda: clock[0])
        trainer = SimpleNamespace(world_size=NPROCS, global_rank=rank, strategy=None)
        for _ in range(3000):
            clock[0] += max(1.0 / rate(history[-lag]) for lag in lags)  # the slower rank sets the pace
            proposal, decided = stage._search_step(trainer)
            history.append(proposal if proposal is not None else history[-1])
            if decided is not None:
                break
        (OUT / f"rank{rank}.json").write_text(json.dumps({"share": decided.share, "why": decided.why,
            "rates": {str(k): v for k, v in decided.rates.items()}, "windows": decided.windows}))
        """,
        tmp_path,
    )
    assert results[0] == results[1]
    assert results[0]["share"] == 1.0, results[0]["why"]
    assert abs(results[0]["rates"]["1.0"] - 16.0) < 1e-6 and abs(results[0]["rates"]["0.0"] - 10.0) < 1e-6
