"""The data path: every loader a Trainer builds passes one declared sequence of stages, and one typed record holds
what the stages know of it. Framework-free; the Lightning adapter (``callbacks/_data_path.py``) owns the one hook
where Lightning hands over its loaders (``Strategy.process_dataloader``) and runs this path there.

The stages, in their fixed order (:data:`STAGES`):

0. ``decode``: where JPEGs are decoded (``StreamPrefetch(decode="gpu"|"auto")``, GPUBoost's ``"auto"``: the
   workers of a recognized torchvision pipeline send the file's bytes and each sample's drawn parameters, the
   ``copy`` stage decodes them on the GPU; :mod:`~lightning_gpu_boost.core.gpu_decode`);
1. ``worker_compute``: what the workers compute (``StreamPrefetch(move_normalize=True)`` moves a torchvision
   dataset's ``ToTensor() + Normalize()`` to the GPU: the workers send uint8 images);
2. ``worker_count``: the worker count (``AutoNumWorkers``, measured on the workers as they now compute);
3. ``span_epochs``: whether the workers load across epoch ends, and the resumable place (``SpanEpochs``; a plain
   training loader is made resumable here too);
4. ``strategy``: the strategy's own processing of the loader (Lightning's, unchanged);
5. ``copy``: the copy to the GPU one batch ahead on a side stream, and what runs on the GPU after it (decode,
   transform, normalize: ``StreamPrefetch``).

A part adds a stage function ``fn(loader, stage) -> loader`` under one of these names (several under one name run in
the order they were added); a new stage is one more name in :data:`STAGES` and its own module (as ``decode`` is).
The record (:class:`LoaderFacts`) is keyed by the loader the user or a DataModule gave (weakly: it goes with the
loader): nothing of ours is set on that loader.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_gpu_boost.core.run_record import RunRecord

__all__ = ["STAGES", "DataPath", "LoaderFacts", "Setting", "StageFn"]

#: the settings a stage owns and training may ask it to decide again: the worker count (``worker_count``) and
#: whether the workers span epochs (``span_epochs``)
Setting = Literal["num_workers", "span_epochs"]

#: the stages every loader passes, in this order
STAGES = ("decode", "worker_compute", "worker_count", "span_epochs", "strategy", "copy")

#: ``fn(loader, stage) -> loader``; ``stage`` is "train", "val", "test", "predict" or None where unknown
StageFn = Callable[[Any, "str | None"], Any]


@dataclass
class LoaderFacts:
    """What the stages know of one loader.

    Attributes:
        normalize: ``(mean, std)`` its uint8 images are normalized with (a DataModule's loader says so), or None.
        workers_by: which part chose its worker count (``None``: the user's), and ``workers_why`` why.
        spanning: the loader whose workers load this one's batches across epoch ends (a new worker count would
            restart them), held weakly; ``None`` where its epochs are not spanned.
        on_gpu: what runs on the GPU after the copy, in order (``"decode"``, ``"transform"``, ``"normalize"``...).
        decode: where its JPEGs are decoded (``"gpu"``, ``"cpu"``, a split ``"gpu 40 %"``), and ``decode_why`` why;
            ``None`` where the GPU decode did not take its dataset over. ``decode_measuring``: ``decode="auto"`` is
            still timing the shares (its steps move work between the workers and the GPU).
    """

    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    workers_by: str | None = None
    workers_why: str = ""
    spanning: Any = None
    on_gpu: list[str] = field(default_factory=list)
    decode: str | None = None
    decode_why: str = ""
    decode_measuring: bool = False

    def spanned_by(self) -> Any:
        """The spanning loader, while it exists."""
        return self.spanning() if self.spanning is not None else None


class DataPath:
    """One Trainer's data path: its stage functions by stage, the facts of its loaders, and the choices its stages
    made (``choices``, the run's :class:`~lightning_gpu_boost.core.run_record.RunRecord`): what training shows is
    proposed through :meth:`propose`, and the stage that owns the setting decides."""

    def __init__(self, choices: RunRecord | None = None) -> None:
        self.choices = choices if choices is not None else RunRecord()
        self._stages: dict[str, dict[str, StageFn]] = {name: {} for name in STAGES}
        self._facts: weakref.WeakKeyDictionary[Any, LoaderFacts] = weakref.WeakKeyDictionary()
        self._plain: dict[int, LoaderFacts] = {}  # loaders that cannot be held weakly (lists, dicts)

    def add(self, stage: str, name: str, fn: StageFn) -> None:
        """Run ``fn`` at ``stage`` (one of :data:`STAGES`) on every loader, under ``name`` (replacing a function of
        that name)."""
        if stage not in self._stages:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}.")
        self._stages[stage][name] = fn

    def remove(self, name: str) -> None:
        for functions in self._stages.values():
            functions.pop(name, None)

    def __bool__(self) -> bool:
        return any(self._stages.values())

    def process(self, loader: Any, stage: str | None, strategy: Callable[[Any], Any]) -> Any:
        """``loader`` through every stage in order; ``strategy``: the strategy's own processing (stage 4)."""
        for name in STAGES:
            if name == "strategy":
                loader = strategy(loader)
                continue
            for fn in list(self._stages[name].values()):
                loader = fn(loader, stage)
        return loader

    def propose(self, setting: Setting, proposal: Any, reason: str, **evidence: Any) -> str | None:
        """Ask the stage that chose ``setting`` to decide again, given ``reason`` (what training showed) and the value
        the evidence points to; what the stage says (it applied ``proposal``, or kept its value and why), or
        ``None`` where no stage of ours chose the setting."""
        return self.choices.decide_again(setting, proposal, reason, **evidence)

    def facts(self, loader: Any) -> LoaderFacts:
        """The record of ``loader`` (made empty on first use)."""
        try:
            found = self._facts.get(loader)
            if found is None:
                found = self._facts[loader] = LoaderFacts()
            return found
        except TypeError:  # not weakly referable
            return self._plain.setdefault(id(loader), LoaderFacts())

    def known(self, loader: Any) -> LoaderFacts | None:
        """The record of ``loader`` where one was made, else ``None``."""
        try:
            return self._facts.get(loader)
        except TypeError:
            return self._plain.get(id(loader))
