"""Benchmarks for numa_utils, measured side by side with the alternatives (issue 7).

Run from the repository root::

    python -m bench all              # prefault, numa_maps, topology, import (< 10 min)
    python -m bench all --quick      # smoke run (small sizes, few rounds)
    python -m bench prefault --size 8G
    python -m bench dma              # GPU hosts only; skips with a reason elsewhere

Results go to bench/results/ (JSON and Markdown) unless ``--out DIR`` says otherwise.
Every benchmark imports numa_utils from the repository root this folder lives in, and
skips (with the reason) any part whose feature that copy does not have yet.
"""
