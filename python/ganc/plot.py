"""`ganc plot OUT`: a run's loss curves as a PNG (matplotlib).

One panel per phase's loss and per value a phase logs besides it (a method returning
`(loss, {name: scalar})`): the mean over ranks and over each log interval (stats.jsonl), with
a band of one standard deviation; a run without stats.jsonl is plotted from rank 0's
loss_history.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys

__all__ = ["plot", "main"]


def _series(out: str) -> dict[str, list[tuple[int, float, float]]]:
    """Per phase, (step, mean, std) points. A file that is not what ganc train writes is a
    ValueError naming the file and line."""
    series: dict[str, list[tuple[int, float, float]]] = {}
    stats = os.path.join(out, "stats.jsonl")
    history = os.path.join(out, "loss_history.csv")
    if not os.path.isdir(out):
        raise ValueError(f"{out} is not a directory (give a run's directory, ganc train --out)")
    if os.path.exists(stats):
        with open(stats) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    for key, value in record.items():
                        if key.startswith(("Loss/", "Stats/")):
                            name = key[5:] + " loss" if key.startswith("Loss/") else key[6:]
                            point = (int(record["step"]), float(value["mean"]), float(value["std"]))
                            series.setdefault(name, []).append(point)
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    raise ValueError(f"{stats}, line {number}: not a stats record ({e!r})") from None
        return series
    if not os.path.exists(history):
        raise ValueError(f"{out} holds no stats.jsonl or loss_history.csv: not a run directory of "
                         "ganc train --out, or a run that has not logged yet")
    with open(history) as f:
        for number, row in enumerate(csv.DictReader(f), 2):
            try:
                point = (int(row["step"]), float(row["loss"]), 0.0)
                series.setdefault(row["phase"] + " loss", []).append(point)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{history}, line {number}: not a step,phase,loss row ({e!r})") from None
    return series


def plot(out: str, output: str | None = None) -> str:
    """Writes the loss curves of the run in `out` to `output` (default OUT/losses.png) and
    returns its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    output = output or os.path.join(out, "losses.png")
    if not output.lower().endswith(".png"):
        raise ValueError(f"-o {output}: the plot is a PNG; give a path ending in .png")
    series = _series(out)
    if not series:
        raise ValueError(f"{out}: no losses logged yet (stats.jsonl is empty)")
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.6 * len(series)), sharex=True,
                             squeeze=False)
    for ax, (phase, points) in zip(axes[:, 0], sorted(series.items())):
        steps = [p[0] for p in points]
        mean = [p[1] for p in points]
        low = [p[1] - p[2] for p in points]
        high = [p[1] + p[2] for p in points]
        ax.plot(steps, mean, lw=1.2)
        ax.fill_between(steps, low, high, alpha=0.25, lw=0)
        ax.set_ylabel(phase)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(os.path.basename(os.path.abspath(out)))
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ganc plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the run's directory (ganc train --out)")
    parser.add_argument("-o", "--output", help="the PNG to write (default OUT/losses.png)")
    args = parser.parse_args(argv)
    try:
        path = plot(args.out, args.output)
    except (OSError, ValueError, KeyError) as e:
        print(f"ganc: error: plot: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
