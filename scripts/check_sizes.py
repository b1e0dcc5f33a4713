#!/usr/bin/env python3
"""Sizes of ganc's own code: no function over 80 lines and no file over 600, in every C++
layer (support/, ir/, passes/, frontend/, backend/, runtime/, tools/), in python/ganc and bench/.
Function lengths come from lizard (a maintained code analyser for C++ and Python); clang-tidy's
readability-function-size checks the same limit on the LibTorch-free layers, where it is fast.
Exit 1, listing each function and file over its limit."""

import argparse
import os
import sys

import lizard

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LAYERS = ["support", "ir", "perf", "passes", "ops", "frontend", "backend", "runtime", "tools", "python/ganc", "bench"]
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".py")
FUNCTION_LINES = 80
FILE_LINES = 600
# Over a limit for a reason given here, and listed by --help so that the reason stays in sight.
EXEMPT: dict = {}


def sources():
    for layer in LAYERS:
        for folder, _, files in os.walk(os.path.join(ROOT, layer)):
            for name in sorted(files):
                if name.endswith(SUFFIXES) and "__pycache__" not in folder:
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def main():
    argparse.ArgumentParser(description=__doc__ + "\n\nexempt:\n" + "\n".join(
        f"  {path}: {why}" for path, why in EXEMPT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    problems = []
    for path in sources():
        if path in EXEMPT:
            continue
        with open(os.path.join(ROOT, path), errors="replace") as f:
            lines = sum(1 for _ in f)
        if lines > FILE_LINES:
            problems.append(f"{path}: {lines} lines (at most {FILE_LINES})")
        for function in lizard.analyze_file(os.path.join(ROOT, path)).function_list:
            if function.length > FUNCTION_LINES:
                problems.append(f"{path}:{function.start_line}: {function.name} is {function.length} "
                                f"lines (at most {FUNCTION_LINES})")
    if problems:
        sys.exit("check_sizes: over the limits:\n  " + "\n  ".join(problems))
    print(f"check_sizes: every function within {FUNCTION_LINES} lines and every file within "
          f"{FILE_LINES} ({len(EXEMPT)} exempt: see --help)")


if __name__ == "__main__":
    main()
