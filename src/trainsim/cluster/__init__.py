"""trainsim.cluster"""
