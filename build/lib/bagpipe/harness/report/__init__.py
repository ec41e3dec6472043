"""Reports: one module per figure family (``fig7``, ``skew``, ``breakdown``, ``convergence``,
``sensitivity`` for the one-knob suites, ``projection`` for ``costmodel`` with the cost model in
``costmodel``), what they share (``loading`` of runs, ``plotting`` and the page writer), and one
command line for all of them (``cli``).

``python -m bagpipe.harness.report <suite> [options]`` is the command line.
"""
