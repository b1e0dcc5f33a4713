"""Writes the zip fuzzer's seed corpus: small archives laid out as torch writes them (stored
entries under one folder), one forced into zip64, one with a comment, one compressed."""
import argparse
import zipfile
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("outdir", help="folder the seed archives are written into (made if missing)")
out = Path(parser.parse_args().outdir)
out.mkdir(parents=True, exist_ok=True)
records = {"archive/data.pkl": b"\x80\x02}q\x00.", "archive/data/0": bytes(range(64)),
           "archive/version": b"3\n"}
for name, kwargs in [("stored", {}), ("zip64", {"force_zip64": True})]:
    with zipfile.ZipFile(out / f"{name}.zip", "w", zipfile.ZIP_STORED) as z:
        for record, payload in records.items():
            with z.open(record, "w", **kwargs) as f:
                f.write(payload)
with zipfile.ZipFile(out / "comment.zip", "w", zipfile.ZIP_STORED) as z:
    z.comment = b"a comment"
    z.writestr("archive/data/0", b"x" * 40)
with zipfile.ZipFile(out / "deflated.zip", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("archive/data/0", b"y" * 200)
