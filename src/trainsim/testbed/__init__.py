"""trainsim.testbed: what emulates and measures the test machine, apart from the model of a cluster.

The validations run several ranks on this one host; this package is everything about that host:

* emulated links: ``netns`` (network namespaces joined by shaped veth links), ``delayline`` (the
  user-space delay line where the kernel has no ``netem``), ``launch`` (one gloo process per rank, in
  a namespace or on loopback);
* measurements: ``calibrate`` (launches the ranks that time a link's collectives here; one rank is
  ``calibrate_worker``, its host passes ``calibrate_host``; the record and its fits, in
  ``cluster.calibration``, belong to the cluster model) and ``machine`` (this host's cost per
  collective, shaped-link efficiency, kernel speed and co-run slowdown, measured once);
* the model of ranks sharing its cores: ``contention`` (a replay in which communication takes host CPU
  from computation and co-located ranks slow each other).

Only ``trainsim.validate``, the ``calibrate`` commands and the benchmarks and tests that measure the
host import it; what-ifs, replay and the planner never do.
"""
