"""trainsim.graph"""
