"""Reads a TensorBoard event file with TensorBoard's own reader and prints its scalars as JSON.

    python3 tools/reference/read_tensorboard.py PATH

PATH is an `events.out.tfevents.*` file or a folder holding one (as `weft runs export RUN
--format tensorboard --output DIR` writes). Needs the `tensorboard` package (pip install
tensorboard). Prints one JSON object on standard output:

    {"tensorboard_version": "...", "file_version": 2.0,
     "scalars": {"<tag>": [[step, value, wall_time], ...], ...}}

with every scalar the file holds (no sampling); `file_version` is the number EventAccumulator
parses from the first event's "brain.Event:2". crates/weft-cli/tests/runs_tensorboard.rs runs
it on an exported file and compares the scalars with the run's store exactly (values as 32-bit
floats, as TensorBoard stores them).
"""

import json
import sys

import tensorboard
from tensorboard.backend.event_processing import event_accumulator


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    acc = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }
    out = {
        "tensorboard_version": tensorboard.__version__,
        "file_version": acc.file_version,
        "scalars": scalars,
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
