"""trainsim.compress"""
