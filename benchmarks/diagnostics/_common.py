"""The benchmarks' shared helpers (``benchmarks/_common.py``), for the one-off diagnosis scripts in this folder.

These scripts explain a figure (where a pipeline's time goes); they carry no bar. Run them from here:
``cd benchmarks/diagnostics && python dali_loop.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the benchmarks themselves (e.g. lmdb_read's helpers)

_spec = importlib.util.spec_from_file_location("_benchmarks_common", Path(__file__).resolve().parents[1] / "_common.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

#: the results folder, wherever a script is run from (``write_result``'s own default is relative to the working
#: directory, and these scripts run from here)
RESULTS = str(Path(__file__).resolve().parents[1] / "results")

carried_over = _shared.carried_over
demo_tree = _shared.demo_tree
dd_read = _shared.dd_read
drop_cache = _shared.drop_cache
parallel_read = _shared.parallel_read
fit_resnet50 = _shared.fit_resnet50
parser_for = _shared.parser_for
record_batches = _shared.record_batches
write_probe = _shared.write_probe
