"""One zoo row half, in its own process: `zoo_child.py NAME real|fake OUT.json`.

real: the truth (tests/zoo_truth.py) and the real report; fake: the --fake report.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import inspector  # noqa: E402, F401 - before torchvision: its C++ ops are replaced

# isort: split
import zoo_compare  # noqa: E402
import zoo_models  # noqa: E402
import zoo_truth  # noqa: E402


def _truth(name: str) -> zoo_truth.Truth:
    zoo = zoo_models.ZOO[name]
    return zoo_truth.measure_truth(zoo.build, zoo.inputs, zoo.loss_fn, draws=zoo.draws)


def _failure(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" ({Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:240] if str(exc) else ''}{where}"


def main(name: str, mode: str, out: str) -> None:
    row: dict = {"ok": False}
    start = time.perf_counter()
    try:
        given = Path(out + ".truth")  # the real half's truth, handed to the fake half
        if given.exists():
            truth = zoo_truth.Truth(**json.loads(given.read_text()))
        else:
            truth = _truth(name)
            row["truth"] = asdict(truth)
        report = zoo_compare.inspect_zoo(name, fake=mode == "fake")
        row.update(zoo_compare.summarize(report, truth), ok=True)
    except BaseException as exc:  # noqa: BLE001 - a row says what failed
        row["error"] = _failure(exc)
    row["seconds_total"] = round(time.perf_counter() - start, 1)
    Path(out).write_text(json.dumps(row))


if __name__ == "__main__":
    main(*sys.argv[1:4])
