"""trainsim.testbed: what emulates and measures the test machine, apart from the model of a cluster.

The validations run several ranks on this one host; this package is everything about that host:
``netns`` (network namespaces joined by shaped veth links), ``delayline`` (the user-space delay line
where the kernel has no ``netem``), ``launch`` (one gloo process per rank, in a namespace or on
loopback), and the calibration that measures links and host here (``calibrate`` launches the ranks,
``calibrate_worker`` is one rank, ``calibrate_host`` its host passes; the record it writes,
``cluster.calibration``, belongs to the cluster model). Only ``trainsim.validate``, the ``calibrate``
commands and the benchmarks and tests that measure the host import it; what-ifs, replay and the
planner never do.
"""
