"""trainsim.testbed: what emulates and measures the test machine, apart from the model of a cluster.

The validations run several ranks on this one host; this package is everything about that host:
``netns`` (network namespaces joined by shaped veth links) and ``delayline`` (the user-space delay
line where the kernel has no ``netem``). Only ``trainsim.validate`` and the benchmarks and tests that
measure the host import it; what-ifs, replay and the planner never do.
"""
