"""Two nodes without a cluster: two torchrun agents on this host (``--nnodes 2 --node-rank 0|1``, one gloo process
each, which its agent forks: ``--run-path --start-method fork``) train one of our DataModules; ranks, node ranks,
the CPU share per node, exact-once sampling and a resume from a mid-epoch checkpoint are checked."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what both scripts start with: this checkout on the path, and a DataModule over ``{samples}`` indices
HEADER = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
from lightning_gpu_boost.datamodules import BoostDataModule
from tests.helpers import IndexDataset, RecordingModel

class Indexed(BoostDataModule):
    def train_dataset(self):
        return IndexDataset({samples})
"""

SCRIPT = HEADER + """
from lightning_gpu_boost.callbacks import GPUUtilWatchdog
from lightning_gpu_boost.core.cpus import processes_per_node

if __name__ == "__main__":
    model = RecordingModel()
    dog = GPUUtilWatchdog(window=2, warmup_steps=1, summary=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[dog])
    trainer.fit(model, datamodule=Indexed(batch_size=4, num_workers=0))
    seen = model.seen["train"]
    out = {{"global_rank": trainer.global_rank, "node_rank": trainer.node_rank, "local_rank": trainer.local_rank,
           "world_size": trainer.world_size, "procs_per_node": processes_per_node(),
           "epochs": [sum(seen[:5], []), sum(seen[5:], [])], "summary": dog.format_summary()}}
    Path({out!r}, f"rank{{trainer.global_rank}}.json").write_text(json.dumps(out))
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
"""


def _free_port() -> int:
    from tests.ports import free_port

    return free_port()


#: one torchrun agent, as ``torchrun ARGS`` runs it (``torch.distributed.run.main``), in its own process group
AGENT = """
import os
os.setsid()  # a hang: the test kills the agent and its ranks together
from torch.distributed.run import main
main({argv!r})
"""


def _two_agents(script: Path, timeout: int = 240) -> None:
    """Run ``script`` under two torchrun agents, node ranks 0 and 1, against a rendezvous on this host.

    Each agent is forked from a process that has imported torch and Lightning (``tests/warm_python.py``), and runs
    its rank with torchrun's ``--run-path --start-method fork`` (the script run as ``__main__`` in a process forked
    from the agent): the same agent, rendezvous and environment as ``torchrun script.py``, without the ~4 s of
    imports that each fresh interpreter (two agents, two ranks) costs the 2-CPU CI machine."""
    from tests.warm_python import WarmProcess

    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT") and not k.startswith(("PL_", "TORCHELASTIC"))}  # fmt: skip
    agents = [
        WarmProcess(code=AGENT.format(argv=[
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--run-path", "--start-method", "fork", str(script)]),
            cwd=script.parent, env=env)  # fmt: skip
        for node in (0, 1)
    ]
    deadline = time.monotonic() + timeout
    for agent in agents:
        agent.proc.join(max(1.0, deadline - time.monotonic()))
        if agent.proc.is_alive():  # a hang: both agents' output says where (it happened once in ~50 CI runs)
            for other in agents:
                if other.proc.is_alive():
                    os.killpg(other.proc.pid, 9)
            logs = [other.wait(10)[1] for other in agents]
            pytest.fail(f"the two agents did not finish in {timeout} s:\n" + "\n".join(log[-3000:] for log in logs))
    done = [agent.wait(10) for agent in agents]
    assert all(code == 0 for code, _ in done), "\n".join(log[-3000:] for _, log in done)


def test_two_simulated_nodes_split_ranks_and_samples(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(root=str(ROOT), samples=40, out=str(out))))
    _two_agents(script)
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 2), (1, 1, 0, 2)]  # fmt: skip
    assert all(r["procs_per_node"] == 1 for r in ranks), "each node's CPUs are shared by its own processes only"
    for epoch in (0, 1):
        shards = [set(r["epochs"][epoch]) for r in ranks]
        assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(range(40))
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1], "a new order each epoch"
    summary = ranks[0]["summary"]  # every rank's row, gathered over both nodes, and which one was slowest
    assert "slowest rank:" in summary and len([line for line in summary.splitlines() if line[:2] in ("0 ", "1 ")]) == 2


RESUME = HEADER + """
from lightning.pytorch.callbacks import ModelCheckpoint

if __name__ == "__main__":  # the three runs one after another in the same two processes (one launch)
    ckpt, out = Path({ckpt!r}), Path({out!r})
    common = dict(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", logger=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=str(out))
    runs = {{}}
    for mode in ("first", "resume", "whole"):
        model, data = RecordingModel(), Indexed(batch_size=4, num_workers=1)
        if mode == "first":  # stopped after 2 of the epoch's 6 steps, with a checkpoint there
            every = ModelCheckpoint(dirpath=str(ckpt), every_n_train_steps=2, save_top_k=-1, save_last=False)
            pl.Trainer(max_steps=2, callbacks=[every], **common).fit(model, datamodule=data)
        elif mode == "resume":
            path = sorted(ckpt.glob("*step=2.ckpt"))[0]
            pl.Trainer(max_epochs=1, enable_checkpointing=False, **common).fit(model, datamodule=data,
                                                                               ckpt_path=str(path))
        else:
            pl.Trainer(max_epochs=1, enable_checkpointing=False, **common).fit(model, datamodule=data)
        runs[mode] = model.seen["train"]
    (out / f"rank{{model.global_rank}}.json").write_text(json.dumps(runs))
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
"""


def test_two_simulated_nodes_resume_mid_epoch_without_repeating_or_skipping(tmp_path):
    """Lightning restarts the epoch for plain loaders; with our DataModules each node's rank goes on from the batch
    after the checkpoint, and the two nodes together still see each sample once."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "resume.py"
    script.write_text(textwrap.dedent(RESUME.format(root=str(ROOT), samples=48, ckpt=str(tmp_path / "ckpt"),
                                                 out=str(out))))  # fmt: skip
    _two_agents(script)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    runs = {mode: [ranks[rank][mode] for rank in (0, 1)] for mode in ("first", "resume", "whole")}
    for rank in (0, 1):
        assert len(runs["first"][rank]) == 2 and len(runs["whole"][rank]) == 6, rank
        assert runs["first"][rank] + runs["resume"][rank] == runs["whole"][rank], rank
    seen = [i for rank in (0, 1) for batch in runs["whole"][rank] for i in batch]
    assert sorted(seen) == list(range(48))


HARNESS = """
import json, logging, sys, warnings
from pathlib import Path
sys.path.insert(0, {root!r})
import tests.resume_harness as harness
from tests.resume_harness import resume_counts

if __name__ == "__main__":
    harness.start_forkserver_by_fork()
    harness.WORKER_CONTEXT = "forkserver"  # see harness.WORKER_CONTEXT
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    data, out = {{k: Path(v) for k, v in {data!r}.items()}}, Path({out!r})
    results = [resume_counts(name, data, out / "work", accelerator="cpu", devices=1, num_nodes=2, strategy="ddp")
               for name in {cases!r}]
    import torch.distributed as dist
    (out / f"rank{{dist.get_rank()}}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
"""


def test_two_simulated_nodes_resume_from_any_step_exactly(tmp_path, resume_report):
    """The resume harness on two nodes (one rank each): every case the package's own loaders cover (DALI's are
    covered on one node, tests/test_resume.py), resumed from every checkpoint, repeats and skips nothing."""
    from tests.resume_harness import make_data

    data = {k: str(v) for k, v in make_data(tmp_path / "data").items()}
    cases = ["boost", "gpu_boost", "lmdb_block", "skip_refill", "transform_seeds"]
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(HARNESS.format(root=str(ROOT), data=data, out=str(out), cases=cases)))
    _two_agents(script, timeout=600)
    for rank in (0, 1):
        for result in json.loads((out / f"rank{rank}.json").read_text()):
            resume_report(f"{result['case']} (two nodes, rank {rank}): {result['resumes']} resumes, "
                          f"{result['repeated']} repeated, {result['skipped']} skipped, {result['wrong_order']} in "
                          f"another order, {result['wrong_values']} with other values")  # fmt: skip
            assert result["resumes"] >= 9 and not result["failures"], result["failures"][:2]
