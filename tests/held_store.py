"""Another process holding a results database open for writing, as a long `vitbench run` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def hold_the_store(results: Path) -> subprocess.Popen:
    """A process that holds `results`' database until killed (it says "held" once it does)."""
    code = (
        "import sys, time; from pathlib import Path; from vitbench import store; "
        "con = store.connect(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(results)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder
