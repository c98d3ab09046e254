"""lakesink write benchmarks: `python -m benchmarks run [--quick]`, `python -m benchmarks profile append`.

See benchmarks/README.md.
"""
