"""Transformations of a task graph: the primitives and the what-ifs written with them.

    >>> from trainsim.transform import select, scale, remove, insert, add_edges, schedule
"""

from trainsim.transform.primitives import add_edges, insert, remove, scale, schedule, select, set_duration

__all__ = ["add_edges", "insert", "remove", "scale", "schedule", "select", "set_duration"]
