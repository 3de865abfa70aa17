"""oneknob's benchmarks (`make bench`): overhead over a hand-written loop, engine starts, probes, reruns, MLflow.

Not tests: nothing here asserts; `python -m benchmarks.run` measures and writes benchmarks/RESULTS.md.
"""
