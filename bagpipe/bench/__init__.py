"""Benchmarks (``nox -s bench``): each module named in ``BENCHMARKS`` exposes ``run(quick: bool) ->
list[dict]``; the parts of one benchmark live in modules named after it (``oracle_*``).

A row is one measurement: ``{"benchmark": ..., "metric": ..., "value": ..., "unit": ...}`` plus
any configuration columns. Ratios that matter are measured within one run, on one machine.
"""

BENCHMARKS = ("data", "data_systems", "oracle", "systems", "fairness", "fault", "fault_logs",
              "het_cache", "network", "collectives")
#: Run only when named (``--only``): mutation testing takes about an hour (``nox -s mutants``);
#: the GPU check is for a machine with a GPU (``nox -s gpu_check``, ``bagpipe.bench.gpu``).
ON_REQUEST = ("mutants", "gpu")
