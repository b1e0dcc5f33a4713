"""TensorBoard event files for a ganc run, from its stats.jsonl and sample grids.

    python -m ganc.tensorboard OUT            # convert a finished run
    python -m ganc.tensorboard OUT --follow   # what rank 0 starts beside a run: follows the
                                              # files as they grow until its stdin closes

Scalars: every stats.jsonl entry (`Loss/<phase>`, `Stats/<phase>/<name>` and `GradNorm/<phase>`
as their mean over ranks and the log interval, `LR/<group>`, `LossScale/<scaler>`,
`Progress/img_per_sec`, `Progress/kimg`, `Timing/sec_per_step`, `Skipped/<phase>`,
`Metrics/<name>` from --metrics)
at its step; images: `samples` from each samples_stepN.png (its PNG bytes as they are).
Written into OUT itself with the tensorboard package's event file writer and protos (what
torch.utils.tensorboard's SummaryWriter writes with, without importing torch: the writer
starts in a fraction of a second beside every run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import struct
import threading
import time

__all__ = ["EventLog", "main"]

_SAMPLE = re.compile(r"samples_step(\d+)\.png$")


class EventLog:
    """Copies what a run has written so far into TensorBoard events; `poll` picks up what is
    new since the last call."""

    def __init__(self, out: str, after_step: int = 0):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self.out = out
        self.writer = EventFileWriter(out)
        self.offset = 0
        self.partial = ""
        self.images: set[str] = set()
        # A run resumed at step N: what came before was sent by the run that wrote it. A
        # SessionLog START at N + 1 makes TensorBoard drop the earlier run's events from there
        # on (written beyond its checkpoint, then trained again), as it does for restarts.
        self.after_step = after_step
        if after_step > 0:
            self.writer.add_event(self._event(wall_time=time.time(), step=after_step + 1,
                                              session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def poll(self) -> None:
        self._scalars()
        self._samples()
        self.writer.flush()

    def _scalars(self) -> None:
        path = os.path.join(self.out, "stats.jsonl")
        if not os.path.exists(path):
            return
        with open(path) as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()  # a line still being written
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            step = record["step"]
            if step <= self.after_step:
                continue
            for key, value in record.items():
                if key in ("step", "timestamp"):
                    continue
                if isinstance(value, dict):
                    value = value["mean"]
                self._add(step, record.get("timestamp"),
                          self._summary.Value(tag=key, simple_value=float(value)))

    def _samples(self) -> None:
        found = [(int(m.group(1)), name) for name in os.listdir(self.out) if (m := _SAMPLE.match(name))]
        for step, name in sorted(found):  # in step order: TensorBoard drops steps that go back
            if name in self.images or step <= self.after_step:
                continue
            with open(os.path.join(self.out, name), "rb") as f:
                png = f.read()
            size = _png_size(png)
            if size is None:  # still being written: next poll
                continue
            self.images.add(name)
            image = self._summary.Image(width=size[0], height=size[1], colorspace=3,
                                        encoded_image_string=png)
            self._add(step, None, self._summary.Value(tag="samples", image=image))

    def _add(self, step: int, walltime: float | None, value) -> None:
        event = self._event(wall_time=walltime or time.time(), step=step,
                            summary=self._summary(value=[value]))
        self.writer.add_event(event)

    def close(self) -> None:
        self.writer.close()


def _png_size(data: bytes):
    """(width, height) of a complete PNG file (its IHDR chunk and IEND trailer), else None."""
    if len(data) < 32 or data[:8] != b"\x89PNG\r\n\x1a\n" or not data.endswith(b"IEND\xaeB`\x82"):
        return None
    return struct.unpack(">II", data[16:24])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ganc.tensorboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the run's directory (ganc train --out)")
    parser.add_argument("--follow", action="store_true",
                        help="keep following the run until stdin closes")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    parser.add_argument("--after-step", type=int, default=0,
                        help="a run resumed at this step: send only what comes after it")
    args = parser.parse_args(argv)
    try:
        log = EventLog(args.out, args.after_step)
    except ImportError as e:
        print(f"ganc: warning: no TensorBoard events ({e}; pip install tensorboard)", file=sys.stderr)
        return 0
    if args.follow:
        # Beside a run it stops when the run closes its stdin: a Ctrl-C at the terminal, which
        # reaches every process of the group, is the run's to handle (it checkpoints and then
        # closes the pipe), not a KeyboardInterrupt traceback here.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        done = threading.Event()

        def wait_for_eof():
            while sys.stdin.buffer.read(4096):
                pass
            done.set()

        threading.Thread(target=wait_for_eof, daemon=True).start()
        while not done.wait(args.poll_seconds):
            log.poll()
    log.poll()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
