"""The run record: what GPUBoost's parts chose in one fit, why, and what they changed since: one view of the run
that the tuners, the prefetcher, the spanning loader and the watchdog write and read (framework-free).

A part that sets a setting records a :class:`Choice` (``record.choose("num_workers", 16, by="AutoNumWorkers",
why=..., decide_again=...)``). The diagnosis never advises a value for a setting that one of our parts chose:
where training shows that choice was wrong, it asks the part to decide again (:meth:`RunRecord.decide_again`), and
the part either applies a new value or keeps its own, saying why in either case; the record keeps both in
:attr:`RunRecord.changes`.

Example::

    >>> record = RunRecord()
    >>> record.choose("num_workers", 16, by="AutoNumWorkers", why="measured fastest",
    ...               decide_again=lambda proposal, reason: (proposal, f"16 -> {proposal}: {reason}"))
    >>> record.decide_again("num_workers", 15, "no CPU left to the training process")
    '16 -> 15: no CPU left to the training process'
    >>> record.chosen("num_workers").value, record.chosen_by()
    (15, {'num_workers': 'AutoNumWorkers'})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Choice", "RunRecord", "run_record"]

#: ``decide_again(proposal, reason, **evidence) -> (value now in force, what the part says about it)``; evidence
#: (figures training measured, e.g. ``training_batches_s``) is passed only where the asker has it
DecideAgain = Callable[..., tuple[Any, str]]


@dataclass
class Choice:
    """One setting one of our parts chose: its value, the part, the reason, and how to ask it again."""

    setting: str
    value: Any
    by: str
    why: str
    decide_again: DecideAgain | None = field(default=None, repr=False)


class RunRecord:
    """The choices of one fit's parts and the changes made to them in training (see the module's docstring)."""

    def __init__(self) -> None:
        self.choices: dict[str, Choice] = {}
        #: ``{"setting", "by", "from", "to", "reason", "said"}`` per decision taken again, in order
        self.changes: list[dict[str, Any]] = []

    def choose(self, setting: str, value: Any, by: str, why: str, decide_again: DecideAgain | None = None) -> None:
        self.choices[setting] = Choice(setting, value, by, why, decide_again)

    def chosen(self, setting: str) -> Choice | None:
        return self.choices.get(setting)

    def chosen_by(self) -> dict[str, str]:
        """``setting -> part`` for every setting a part chose."""
        return {name: choice.by for name, choice in self.choices.items()}

    def decide_again(self, setting: str, proposal: Any, reason: str, **evidence: Any) -> str | None:
        """Ask the part that chose ``setting`` to decide again, given ``reason`` and the value the evidence points
        to; returns what the part says (it applied ``proposal``, or kept its value and why), or ``None`` where no
        part chose the setting or the part cannot decide again. Asked once per setting and proposal. ``evidence``:
        figures the part may weigh (e.g. ``training_batches_s``), passed on where given."""
        choice = self.choices.get(setting)
        if choice is None or choice.decide_again is None:
            return None
        for change in self.changes:
            if change["setting"] == setting and change["proposal"] == proposal:
                return change["said"]
        before = choice.value
        evidence = {k: v for k, v in evidence.items() if v is not None}
        value, said = choice.decide_again(proposal, reason, **evidence) if evidence else choice.decide_again(proposal, reason)
        choice.value = value
        self.changes.append({"setting": setting, "by": choice.by, "from": before, "to": value, "proposal": proposal,
                             "reason": reason, "said": said})  # fmt: skip
        return said


#: the owner's attribute that holds its record: the record refers to the parts, which refer to the owner, so it must
#: live inside the owner (a weak-keyed table whose values lead back to their key would keep every owner alive)
_ATTRIBUTE = "_gpu_boost_run_record"


def run_record(owner: Any) -> RunRecord:
    """The record of ``owner``'s run (the Trainer), made at the first call; it lives as long as the owner."""
    record = vars(owner).get(_ATTRIBUTE)
    if record is None:
        record = RunRecord()
        setattr(owner, _ATTRIBUTE, record)
    return record
