"""Exports a zoo model to a TorchScript archive with its ganc spec.

    python3 models/export.py dcgan64 -o dcgan64.pt [--trace]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ganc  # noqa: E402
import zoo  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="zoo model: " + ", ".join(sorted(zoo.ZOO) + sorted(zoo.LARGE)))
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--trace", action="store_true", help="trace the phase methods instead of scripting")
    args = parser.parse_args()
    gan, spec = zoo.build(args.name)
    spec = ganc.export(gan, args.output, spec, trace=args.trace)
    print(f"wrote {args.output}: {spec['name']}, phases " + ", ".join(p["name"] for p in spec["phases"]))


if __name__ == "__main__":
    main()
