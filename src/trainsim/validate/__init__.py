"""trainsim.validate"""
